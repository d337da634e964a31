"""SlotDecoder: the host side of the static decode state (model/decode/slots.py).

The host admits sentences into free slots (encoder and cross-attention projections run eagerly
there), launches steps, and collects the sentences that finished. It never waits on the device in
the loop: after each step the `finished` flags are copied to a pinned buffer behind an event, and
`collect` reads the copy of an earlier step once its event has completed. A slot's finished
hypotheses stay in place until the host has read them, since steps leave inactive slots alone.

Each launch reads only the target and source positions its sentences need: the smallest bucket
(16, 32, 64, ... positions) that holds every busy slot's position and source, which the host knows
without asking the device. With `graphs=True` (CUDA), each bucket's step is captured as a CUDA graph
the first time it is needed, all in one memory pool, and replayed after that; the state's tensors
are never rebound, so the graphs keep reading them.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from model.decode.search import NEG, Hypothesis, SearchOptions
from model.decode.slots import TORCH_STEP, SlotState, StepKernels, decode_step
from model.nn.transformer import Seq2Seq
from model.options import DecodeOptions, max_length

RING = 4  # launched steps whose finished flags may wait to be collected
SPARE = 1  # positions the state holds past the longest bucket (__init__ says why)


@dataclass(frozen=True)
class PoolShape:
    slots: int = 64  # S sentences decoding at once
    beams: int = 4  # K: every sentence in the pool decodes with this beam size
    target_len: int = 256  # T: the longest output a sentence may ask for, </s> included
    source_len: int = 128  # P: the longest source, </s> included
    ngram_max: int = 4  # the largest no_repeat_ngram_size the pool hosts


class SlotDecoder:
    """A pool of S slots x K beams on one device, for one model."""

    def __init__(
        self,
        model: Seq2Seq,
        shape: PoolShape,
        *,
        device: torch.device,
        graphs: bool = False,
        compiled: bool = False,
        kernels: StepKernels = TORCH_STEP,
    ) -> None:
        """compiled: the step through torch.compile's inductor (fullgraph; on CUDA captured as a graph after it),
        its operators fused into fewer kernels: the same tokens as the eager step, floats within rounding.
        kernels: what computes the step's attentions and log-probabilities (model/plan.py chooses)."""
        if compiled and kernels is not TORCH_STEP:
            raise ValueError(f"a compiled step compiles PyTorch's operators, not the {kernels.name} kernels")
        self.kernels = kernels
        cfg = model.cfg
        self.model, self.shape, self.device = model, shape, device
        # One position past the longest bucket, which no step reads: every bucket's views of the state are then
        # strided alike, none the whole (contiguous) tensor, so inductor compiles one graph for all, not four.
        self.state = SlotState.allocate(
            model, shape.slots, shape.beams, shape.target_len + SPARE, shape.source_len + SPARE, device=device,
            bans=shape.ngram_max > 0 and kernels.fused is not None,  # the fused step's mask: V bytes a row
        )  # fmt: skip
        # What the model fixes; no_repeat_ngram_size bounds the slots' own sizes (slots.decode_step).
        self.opts = SearchOptions(
            eos_token_id=cfg.eos_token_id,
            start_token_id=cfg.decoder_start_token_id,
            suppressed_token_ids=(cfg.pad_token_id,),
            forced_eos_token_id=cfg.forced_eos_token_id,
            no_repeat_ngram_size=shape.ngram_max,
        )
        self.free = list(range(shape.slots))
        self.keep: dict[int, int] = {}  # slot -> num_hypotheses of the sentence in it
        self.steps: dict[int, int] = {}  # busy slot -> steps launched since admission (>= its position)
        self.source: dict[int, int] = {}  # busy slot -> its source length
        cuda = device.type == "cuda"
        if graphs and not cuda:
            raise ValueError("CUDA graphs need a CUDA device")
        # A ring of host buffers for the finished flags of launched steps not yet collected, each with
        # its event and the slots' generations at launch (a slot reused since is not that sentence).
        self._buffers = [torch.zeros(shape.slots, dtype=torch.bool, pin_memory=cuda) for _ in range(RING)]
        self._events = [torch.cuda.Event() if cuda else None for _ in range(RING)]  # type: ignore[no-untyped-call]
        self._pending: deque[tuple[int, list[int]]] = deque()  # (ring index, generations)
        self._launches = 0
        self._generation = [0] * shape.slots
        self._side = torch.cuda.Stream() if cuda else None  # type: ignore[no-untyped-call]  # reads results
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] | None = {} if graphs else None
        self._pool = torch.cuda.graph_pool_handle() if graphs else None
        if compiled and (missing := _compiler_missing(device)):
            raise RuntimeError(f"compiling the decode step: {missing}")
        # One graph dynamic in the buckets' lengths (the step's only Python numbers) serves every bucket.
        self._compiled = torch.compile(decode_step, fullgraph=True, dynamic=True) if compiled else None

    def fits(self, opts: DecodeOptions, source_len: int, max_len: int) -> bool:
        """Whether a sentence with these options can decode in this pool (else: the eager path)."""
        s = self.shape
        return (
            opts.beam_size == s.beams
            and opts.num_hypotheses <= s.beams
            and source_len <= s.source_len
            and max_len <= s.target_len
            and opts.no_repeat_ngram_size <= s.ngram_max
        )

    @torch.inference_mode()
    def admit(self, sources: list[list[int]], opts: list[DecodeOptions], max_lens: list[int]) -> list[int]:
        """Write each (non-empty) source into a free slot; returns the slots, in order."""
        if len(sources) > len(self.free):
            raise ValueError(f"{len(sources)} sentences for {len(self.free)} free slots")
        slots = [self.free.pop(0) for _ in sources]
        st, dev, P = self.state, self.device, self.state.src_mask.shape[1]
        beams = st.search
        idx = torch.tensor(slots, device=dev)
        lengths = [len(s) for s in sources]
        ids = torch.full((len(sources), max(lengths)), self.model.cfg.pad_token_id, dtype=torch.long)
        for r, src in enumerate(sources):
            ids[r, : len(src)] = torch.tensor(src)
        mask = torch.arange(ids.shape[1])[None, :] < torch.tensor(lengths)[:, None]
        ids, mask = ids.to(dev), mask.to(dev)
        memory = self.model.encode(ids, mask)  # (b, s, C)
        s = ids.shape[1]
        for i, layer in enumerate(self.model.decoders):
            k, v = layer.cross_attn.project_kv(memory)  # (b, H, s, D)
            st.cross_k[i].index_copy_(0, idx, torch.nn.functional.pad(k, (0, 0, 0, P - s)))
            st.cross_v[i].index_copy_(0, idx, torch.nn.functional.pad(v, (0, 0, 0, P - s)))
        st.src_mask.index_copy_(0, idx, torch.nn.functional.pad(mask, (0, P - s)))
        K = self.shape.beams

        def put(t: torch.Tensor, values: list[float] | list[int] | list[bool]) -> None:
            t.index_copy_(0, idx, torch.tensor(values, dtype=t.dtype, device=dev))

        put(st.max_len, max_lens)
        put(st.min_len, [o.min_decoding_length for o in opts])
        put(st.length_penalty, [o.length_penalty for o in opts])
        put(st.early_stopping, [o.early_stopping for o in opts])
        put(st.ngram, [o.no_repeat_ngram_size for o in opts])
        put(st.first_token, [-1 if o.forced_bos_token_id is None else o.forced_bos_token_id for o in opts])
        put(st.pos, [0] * len(slots))
        put(beams.improvable, [True] * len(slots))
        put(st.finished, [False] * len(slots))
        start = torch.zeros(len(slots), K, device=dev)
        start[:, 1:] = NEG  # all beams start identical: expand only the first
        beams.run_scores.index_copy_(0, idx, start)
        beams.run_tokens.index_fill_(0, idx, -1)
        beams.fin_scores.index_fill_(0, idx, NEG)
        beams.fin_tokens.index_fill_(0, idx, -1)
        beams.fin_flags.index_fill_(0, idx, False)
        rows = (idx[:, None] * K + torch.arange(K, device=dev)).reshape(-1)
        st.tokens.index_fill_(0, rows, self.opts.start_token_id)
        put(st.active, [True] * len(slots))
        for slot, o, n in zip(slots, opts, lengths, strict=True):
            self.keep[slot], self.steps[slot], self.source[slot] = o.num_hypotheses, 0, n
            self._generation[slot] += 1
        return slots

    @torch.inference_mode()
    def cancel(self, slots: list[int]) -> None:
        """Stop the sentences in these slots (a client left) and free the slots."""
        if not slots:
            return
        self.state.active.index_fill_(0, torch.tensor(slots, device=self.device), False)
        for slot in slots:
            del self.keep[slot], self.steps[slot], self.source[slot]
            self._generation[slot] += 1
            self.free.append(slot)

    def bucket(self) -> tuple[int, int]:
        """(target, source) positions the next step must read."""
        s = self.shape
        t = _bucket(max(self.steps.values(), default=0) + 1, s.target_len)
        return t, _bucket(max(self.source.values(), default=1), s.source_len)

    @torch.inference_mode()
    def launch(self) -> None:
        """Run one step for every slot, and copy its finished flags out behind an event."""
        t_len, p_len = self.bucket()
        if self._graphs is not None:
            graph = self._graphs.get((t_len, p_len)) or self._capture(t_len, p_len)
            graph.replay()
        else:
            self._run(self.model, self.state, self.opts, t_len, p_len)
        for slot in self.steps:
            self.steps[slot] += 1
        if len(self._pending) == RING:
            raise RuntimeError(f"{RING} steps launched and not collected")
        i = self._launches % RING
        self._launches += 1
        event = self._events[i]
        self._buffers[i].copy_(self.state.finished, non_blocking=event is not None)
        if event is not None:
            event.record()
        self._pending.append((i, list(self._generation)))

    @torch.inference_mode()
    def collect(self, *, lag: int = 0, wait: bool = True) -> dict[int, list[Hypothesis]]:
        """The sentences that launched steps finished, by slot (their slots become free), for every
        step but the last `lag` launched: with lag 1 the host reads step n-1's results while the device
        runs step n. Without `wait`, steps still running are left for a later call."""
        out: dict[int, list[Hypothesis]] = {}
        while len(self._pending) > lag:
            i, generation = self._pending[0]
            event = self._events[i]
            if event is not None:
                if not wait and not event.query():  # type: ignore[no-untyped-call]
                    break
                event.synchronize()
            self._pending.popleft()
            # Host memory: no device sync. A slot cancelled or reused since that step is another's.
            flagged = self._buffers[i].nonzero()[:, 0].tolist()
            done = [s for s in flagged if generation[s] == self._generation[s] and s in self.keep]
            if done:
                out.update(self._harvest(done, event))
        return out

    def _harvest(self, done: list[int], event: torch.cuda.Event | None) -> dict[int, list[Hypothesis]]:
        """Read the finished slots' hypotheses and free the slots. On CUDA the copies run on a side
        stream that waits only for the step that finished them (later steps leave those slots alone)."""
        if self._side is not None and event is not None:
            self._side.wait_event(event)
            with torch.cuda.stream(self._side):
                return self._read(done)
        return self._read(done)

    def _read(self, done: list[int]) -> dict[int, list[Hypothesis]]:
        idx = torch.tensor(done, device=self.device)
        beams = self.state.search
        flags = beams.fin_flags.index_select(0, idx).cpu()
        scores = beams.fin_scores.index_select(0, idx).cpu()
        tokens = beams.fin_tokens.index_select(0, idx).cpu()
        out: dict[int, list[Hypothesis]] = {}
        eos = self.opts.eos_token_id
        for r, slot in enumerate(done):
            hyps = []
            for k in range(self.keep.pop(slot)):
                if bool(flags[r, k]):
                    ids = [t for t in tokens[r, k].tolist() if t >= 0]
                    hyps.append(Hypothesis(ids[:-1] if ids and ids[-1] == eos else ids, float(scores[r, k])))
            out[slot] = hyps
            self.free.append(slot)
            del self.steps[slot], self.source[slot]
        return out

    @property
    def busy(self) -> int:
        """Slots holding a sentence not yet collected."""
        return self.shape.slots - len(self.free)

    def _run(self, *step: Any) -> None:
        """One step: the compiled one, or slots.decode_step as it is named now."""
        if self._compiled is not None:
            self._compiled(*step)
        else:
            functools.partial(decode_step, kernels=self.kernels)(*step)

    @torch.inference_mode()
    def prepare(self) -> None:
        """Compile (compiled) and capture (graphs) every bucket's step now, the state left as it was: else each
        happens at its bucket's first step, a compilation some tens of seconds into the decoding."""
        buckets = [(t, p) for t in _buckets(self.shape.target_len) for p in _buckets(self.shape.source_len)]
        if self._graphs is not None:  # each capture keeps the state as it was
            for t_len, p_len in buckets:
                if (t_len, p_len) not in self._graphs:
                    self._capture(t_len, p_len)
        elif self._compiled is not None:
            with self.state.kept():
                for t_len, p_len in buckets:
                    self._run(self.model, self.state, self.opts, t_len, p_len)

    def _capture(self, t_len: int, p_len: int) -> torch.cuda.CUDAGraph:
        """Record bucket (t_len, p_len)'s step as a CUDA graph in the shared pool; the state is left as
        it was (the warm-up and captured steps write to it, so it is restored)."""
        assert self._graphs is not None
        step = (self.model, self.state, self.opts, t_len, p_len)
        graph = torch.cuda.CUDAGraph()
        with self.state.kept():
            stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up: the allocator, kernel choices and compilation happen outside the capture
                    self._run(*step)
            torch.cuda.current_stream().wait_stream(stream)
            with torch.cuda.graph(graph, pool=self._pool):
                self._run(*step)
        self._graphs[(t_len, p_len)] = graph
        return graph


def _compiler_missing(device: torch.device) -> str | None:
    """What inductor lacks on this host to build its kernels, or None: a C++ compiler for CPU kernels, a C
    compiler for Triton's launchers on CUDA (found as each finds its own)."""
    if device.type == "cuda":
        found = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
        return None if found else "Triton needs a C compiler (gcc or clang on PATH, or CC) and this host has none"
    if not shutil.which(os.environ.get("CXX", "g++")):  # inductor's config.cpp.cxx
        return "inductor needs a C++ compiler (g++ on PATH, or CXX) and this host has none"
    return None


def _bucket(n: int, cap: int) -> int:
    """The smallest of 16, 32, 64, ... that is at least n, and at most cap."""
    return min(cap, max(16, 1 << (n - 1).bit_length()))


def _buckets(cap: int) -> list[int]:
    """Every bucket of up to cap positions."""
    found: list[int] = []
    n = 1
    while not found or found[-1] < cap:
        found.append(_bucket(n, cap))
        n = found[-1] + 1
    return found


def decode_all(
    decoder: SlotDecoder, sources: list[list[int]], opts: list[DecodeOptions], *, join_every: int = 1, lag: int = 0
) -> list[list[Hypothesis]]:
    """Decode every (non-empty) source through the pool, admitting as slots free up; sentences join
    `join_every` steps apart at most, and results are collected `lag` steps late (a test and
    benchmark driver, and the reference loop)."""
    positions = decoder.model.cfg.max_position_embeddings
    results: list[list[Hypothesis] | None] = [None] * len(sources)
    waiting = list(range(len(sources)))
    where: dict[int, int] = {}
    step = 0
    while waiting or decoder.busy:
        if waiting and decoder.free and step % join_every == 0:
            batch = waiting[: len(decoder.free)]
            waiting = waiting[len(batch) :]
            caps = [max_length(opts[i], len(sources[i]), positions) for i in batch]
            slots = decoder.admit([sources[i] for i in batch], [opts[i] for i in batch], caps)
            where.update(zip(slots, batch, strict=True))
        decoder.launch()
        for slot, hyps in decoder.collect(lag=lag).items():
            results[where.pop(slot)] = hyps
        step += 1
    return [r if r is not None else [] for r in results]
