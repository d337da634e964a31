"""Continuous batching on the static decode state (model/decode/slot_decoder.py).

The runner the engine uses on a GPU: sentences the pool can host (its beam size, source and output
lengths, n-gram size) decode in the pool, one CUDA graph replay a step; any other sentence decodes
beside them in an InflightBatch, as on a CPU. Like StepRunner it applies the scheduler's plan and
runs one step; it never decides admission.
"""

from __future__ import annotations

from model.decode.inflight import InflightBatch
from model.decode.search import Hypothesis
from model.decode.slot_decoder import PoolShape, SlotDecoder
from model.options import DecodeOptions, max_length
from model.translator import Translator
from service.engine.scheduler import Plan, WorkItem, mark_encoded


class SlotPoolError(RuntimeError):
    """The static decode state failed (a graph capture, a step); the engine goes on without it."""


class SlotStepRunner:
    """The pool (decode_slots // beams slots of `beams` beams) plus an InflightBatch for the rest."""

    def __init__(
        self, translator: Translator, slots: int, max_length: int, *, beams: int, graphs: bool, compiled: bool = False
    ) -> None:
        """compiled: the pool's step through torch.compile's inductor, every bucket compiled (and on a GPU
        captured) here, so no request waits on a compilation."""
        self.translator = translator
        self.batch = InflightBatch(translator.model, rows=slots, max_length=max_length)
        shape = PoolShape(
            slots=max(1, slots // beams),
            beams=beams,
            target_len=self.batch.max_length,
            source_len=translator.max_source_tokens,
        )
        self.pool = SlotDecoder(
            translator.model,
            shape,
            device=translator.device,
            graphs=graphs,
            compiled=compiled,
            kernels=translator.step_kernels,
        )
        if compiled:
            self.pool.prepare()
        # On a GPU the host reads a step's finished sentences while the next step runs.
        self.lag = 1 if translator.device.type == "cuda" else 0
        self.seq_of: dict[int, int] = {}  # pool slot -> the sentence's seq
        self.slot_of: dict[int, int] = {}  # seq -> pool slot

    @property
    def rows(self) -> int:
        """Hypothesis rows decoding: the pool's busy slots' beams and the InflightBatch's rows."""
        return self.pool.busy * self.pool.shape.beams + self.batch.rows

    def execute(self, plan: Plan) -> tuple[int, list[tuple[int, list[Hypothesis]]]]:
        """Drop leavers, admit joiners (into the pool where they fit), step both; as StepRunner.execute."""
        in_pool = [it.seq for it in plan.leave if it.seq in self.slot_of]
        rest = {it.seq for it in plan.leave} - set(in_pool)
        slots = [self.slot_of.pop(seq) for seq in in_pool]
        for slot in slots:
            del self.seq_of[slot]
        self.pool.cancel(slots)
        if rest:
            self.batch.remove(rest)  # type: ignore[arg-type]
        self._admit(plan.join)
        mark_encoded(plan.join)
        rows = self.rows
        finished: list[tuple[int, list[Hypothesis]]] = []
        if self.pool.busy:
            try:
                self.pool.launch()
                collected = self.pool.collect(lag=self.lag)
            except Exception as exc:
                raise SlotPoolError(f"the static decode state failed: {exc!r}") from exc
            for slot, hyps in collected.items():
                seq = self.seq_of.pop(slot)
                del self.slot_of[seq]
                finished.append((seq, hyps))
        if self.batch.rows:
            finished += [(int(seq), hyps) for seq, hyps in self.batch.step()]  # type: ignore[call-overload]
        return rows, finished

    def _admit(self, items: list[WorkItem]) -> None:
        tr = self.translator
        positions = min(tr.model.cfg.max_position_embeddings, self.batch.max_length)
        pooled: list[tuple[WorkItem, int]] = []
        others: dict[DecodeOptions, list[WorkItem]] = {}
        for it in items:
            cap = max_length(it.opts, len(it.ids), positions)
            if len(pooled) < len(self.pool.free) and self.pool.fits(it.opts, len(it.ids), cap):
                pooled.append((it, cap))
            else:
                others.setdefault(it.opts, []).append(it)
        if pooled:
            slots = self.pool.admit([it.ids for it, _ in pooled], [it.opts for it, _ in pooled], [c for _, c in pooled])
            for slot, (it, _) in zip(slots, pooled, strict=True):
                self.seq_of[slot], self.slot_of[it.seq] = it.seq, slot
        for opts, group in others.items():
            sources = [it.ids for it in group]
            caps = tr.max_lengths(sources, opts).clamp(max=self.batch.max_length)
            self.batch.add([it.seq for it in group], sources, caps.tolist(), tr.search_options(opts))
