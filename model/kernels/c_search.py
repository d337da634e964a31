"""The beam search's passes in C (csrc/search.c, beam_steps.c): the candidate ranking, a beam step, the step with
its bookkeeping (BeamAdvance), and a search's steps in one call."""

from __future__ import annotations

import ctypes

import torch

from model.kernels import c_layers, native

MOST_CANDIDATES = 64


BeamStep = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]  # what BeamAdvance returns
P, Q = ctypes.c_void_p, ctypes.c_int64


class Beams(ctypes.Structure):
    """csrc/beamserve.h's beamserve_beams: a BeamState's tensors, each sentence's length limit, the end token."""

    _fields_ = [
        ("run_scores", P), ("run_tokens", P), ("fin_scores", P), ("fin_tokens", P), ("fin_flags", P),
        ("improvable", P), ("max_lengths", P), ("batch", Q), ("K", Q), ("T", Q), ("eos", Q), ("early_stopping", Q),
    ]  # fmt: skip

    @classmethod
    def of(cls, state: tuple[torch.Tensor, ...], max_lengths: torch.Tensor, eos: int, early_stopping: bool) -> Beams:
        b, K, T = state[1].shape
        return cls(*(t.data_ptr() for t in state), max_lengths.data_ptr(), b, K, T, eos, int(early_stopping))


class Rules(ctypes.Structure):
    """csrc/beamserve.h's beamserve_rules: search.constrain's rules for options shared by every row."""

    _fields_ = [("suppressed", P), ("n_suppressed", Q), ("min_length", Q), ("forced_bos", Q), ("forced_eos", Q)]


class BeamAnswer(ctypes.Structure):
    """csrc/beamserve.h's beamserve_beam_answer: where a beam step writes src_beam, token, done and rows."""

    _fields_ = [("src_beam", P), ("token", P), ("done", P), ("rows", P)]

    @classmethod
    def into(cls, tensors: tuple[torch.Tensor, ...]) -> BeamAnswer:
        return cls(*(t.data_ptr() for t in tensors))


class Decoder(ctypes.Structure):
    """csrc/beamserve.h's beamserve_decoder: the layers' structs, the source map and the embedding a step reads."""

    _fields_ = [
        ("layers", P), ("own", P), ("source", P), ("L", Q), ("map", c_layers.SourceMap),
        ("embed", P), ("V", Q), ("C", Q), ("scale", ctypes.c_float), ("out", ctypes.POINTER(c_layers.LinearC)),
    ]  # fmt: skip


def top_candidates(
    log_probs: torch.Tensor, run_scores: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """search.top_candidates in one pass: log_probs (b, K, V) and run_scores (b, K) float32 on CPU, n at
    most MOST_CANDIDATES -> scores, beam, token, each (b, n). Only where built()."""
    lib = native.kernels()
    b, K, V = log_probs.shape
    native.check(0 < n <= min(MOST_CANDIDATES, K * V), "top_candidates", f"1 to {MOST_CANDIDATES} candidates of K * V")
    native.check(run_scores.shape == (b, K), "top_candidates", f"run_scores ({b}, {K})")
    native.check(log_probs.dtype == run_scores.dtype == torch.float32, "top_candidates", "float32 scores")
    lp, run = log_probs.contiguous(), run_scores.contiguous()
    scores = torch.empty(b, n)
    beam, token = torch.empty(b, n, dtype=torch.int64), torch.empty(b, n, dtype=torch.int64)
    failed = lib.beamserve_top_candidates(
        lp.data_ptr(), run.data_ptr(), b, K, V, n, scores.data_ptr(), beam.data_ptr(), token.data_ptr()
    )
    if failed:  # the kernel's own check of n against its buffers
        raise IndexError(f"top_candidates: {n} candidates of {K} x {V}: the kernel holds 1 to {MOST_CANDIDATES}")
    return scores, beam, token


def beam_step(
    log_probs: torch.Tensor,
    state: tuple[torch.Tensor, ...],
    pos: torch.Tensor,
    max_lengths: torch.Tensor,
    norm: torch.Tensor,
    eos: int,
    early_stopping: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """search.beam_step in one call, over log_probs (b, K, V) float32 contiguous, for one length penalty and one
    early_stopping: state is the BeamState's run_scores, run_tokens, fin_scores, fin_tokens, fin_flags and
    improvable, updated in place; pos, max_lengths (b,) int64; norm (b,) float32, (pos + 1) ** length_penalty.
    Returns src_beam, token (b, K) and done (b,), as search.beam_step. Only where built() and 2 K <=
    MOST_CANDIDATES."""
    lib = native.kernels()
    b, K, V = log_probs.shape
    run_scores, run_tokens, fin_scores, fin_tokens, fin_flags, improvable = state
    T = run_tokens.shape[2]
    if not (
        log_probs.dtype == run_scores.dtype == fin_scores.dtype == norm.dtype == torch.float32
        and run_tokens.dtype == fin_tokens.dtype == pos.dtype == max_lengths.dtype == torch.int64
        and fin_flags.dtype == improvable.dtype == torch.bool
        and run_scores.shape == fin_scores.shape == fin_flags.shape == (b, K)
        and run_tokens.shape == fin_tokens.shape == (b, K, T)
        and improvable.shape == pos.shape == max_lengths.shape == norm.shape == (b,)
        and all(t.is_contiguous() for t in (log_probs, *state, pos, max_lengths, norm))
    ):  # fmt: skip
        raise ValueError("beam_step: a BeamState's tensors, contiguous, beside (b, K, V) float32 log-probabilities")
    src_beam, token = torch.empty(b, K, dtype=torch.int64), torch.empty(b, K, dtype=torch.int64)
    done = torch.empty(b, dtype=torch.bool)
    beams = Beams.of(state, max_lengths, eos, early_stopping)
    answer = BeamAnswer(src_beam.data_ptr(), token.data_ptr(), done.data_ptr(), None)  # the rows: beam_advance's
    failed = lib.beamserve_beam_step(
        log_probs.data_ptr(), V, ctypes.byref(beams), pos.data_ptr(), norm.data_ptr(), ctypes.byref(answer)
    )
    if failed == -2:
        raise IndexError(f"beam_step: {2 * K} candidates of {K} x {V}: the kernel ranks at most {MOST_CANDIDATES}")
    if failed:
        raise MemoryError("no memory for the beam step")
    return src_beam, token, done


class BeamAdvance:
    """csrc/search.c's beamserve_beam_advance for one beam search: search.constrain's rules for options shared by
    every row, then search.beam_step, in one call a step. Built over a BeamState's fields (run_scores,
    run_tokens, fin_scores, fin_tokens, fin_flags, improvable: contiguous, updated in place) and max_lengths
    (b,) int64; built again when the search drops sentences (they are new tensors)."""

    def __init__(
        self,
        state: tuple[torch.Tensor, ...],
        max_lengths: torch.Tensor,
        *,
        eos: int,
        early_stopping: bool,
        suppressed: tuple[int, ...],
        min_length: int,
        forced_bos: int | None,
        forced_eos: int | None,
    ) -> None:
        run_scores, run_tokens, fin_scores, fin_tokens, fin_flags, improvable = state
        b, K, T = run_tokens.shape
        if not (
            run_scores.dtype == fin_scores.dtype == torch.float32
            and run_tokens.dtype == fin_tokens.dtype == max_lengths.dtype == torch.int64
            and fin_flags.dtype == improvable.dtype == torch.bool
            and run_scores.shape == fin_scores.shape == fin_flags.shape == (b, K)
            and fin_tokens.shape == (b, K, T)
            and improvable.shape == max_lengths.shape == (b,)
            and all(t.is_contiguous() and t.device.type == "cpu" for t in (*state, max_lengths))
        ):  # fmt: skip
            raise ValueError("BeamAdvance: a BeamState's contiguous CPU tensors, and max_lengths (b,) int64")
        self.b, self.K = b, K
        self.suppressed = torch.tensor(suppressed, dtype=torch.int64)
        self.held = (*state, max_lengths)  # the tensors the structs below point into
        self.beams = Beams.of(state, max_lengths, eos, early_stopping)
        bos_id, eos_id = (-1 if i is None else i for i in (forced_bos, forced_eos))
        self.rules = Rules(self.suppressed.data_ptr(), len(suppressed), min_length, bos_id, eos_id)
        self.ids = (*suppressed, eos, forced_bos or 0, forced_eos or 0)
        self.V = 0  # the vocabulary every id was checked against

    def __call__(
        self, log_probs: torch.Tensor, pos: int | torch.Tensor, norm: float | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """log_probs (b, K, V) float32 contiguous, constrained in place, every sentence at step pos (an int), or
        each at its own (b,) int64; norm its (pos + 1) ** length_penalty, one float or (b,) float32. Returns
        src_beam, token (b, K), done (b,) as search.beam_step, the search rows (b K,) the new rows continue (for a
        reorder where none is done), and how many sentences are done."""
        b, K = self.b, self.K
        V = log_probs.shape[-1]
        self.check_vocabulary(V)
        if not (
            log_probs.shape == (b, K, V)
            and log_probs.dtype == torch.float32
            and log_probs.is_contiguous()
            and log_probs.device.type == "cpu"
        ):  # fmt: skip
            raise ValueError(f"BeamAdvance: ({b}, {K}, V) float32 contiguous CPU log-probabilities")
        positions, at = (None, pos) if isinstance(pos, int) else (_each(pos, b, torch.int64).data_ptr(), 0)
        norms, one = (None, norm) if isinstance(norm, float) else (_each(norm, b, torch.float32).data_ptr(), 0.0)
        src_beam, token, done, rows = found = self.answer()
        ended = native.kernels().beamserve_beam_advance(
            log_probs.data_ptr(),
            V,
            ctypes.byref(self.beams),
            ctypes.byref(self.rules),
            positions,
            at,
            norms,
            one,
            ctypes.byref(BeamAnswer.into(found)),
        )
        self.check_answer(ended, V)
        return src_beam, token, done, rows, ended

    def answer(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Empty src_beam, token (b, K), done (b,) and rows (b K,), for beamserve_beam_advance to write."""
        b, K = self.b, self.K
        src_beam, token = torch.empty(b, K, dtype=torch.int64), torch.empty(b, K, dtype=torch.int64)
        return src_beam, token, torch.empty(b, dtype=torch.bool), torch.empty(b * K, dtype=torch.int64)

    def check_answer(self, ended: int, V: int) -> None:
        """beamserve_beam_advance's failures over a vocabulary of V, as exceptions."""
        if ended == -2:
            K = self.K
            raise IndexError(f"beam_step: {2 * K} candidates of {K} x {V}: the kernel ranks at most {MOST_CANDIDATES}")
        if ended < 0:
            raise MemoryError("no memory for the beam step")

    def check_vocabulary(self, V: int) -> None:
        """IndexError unless every id of the search's rules is below V (checked once per V)."""
        if V != self.V:
            if not all(0 <= i < V for i in self.ids):
                raise IndexError(f"BeamAdvance: a token id of the search's rules outside a vocabulary of {V}")
            self.V = V


def beam_steps(
    chain: tuple[ctypes.Array[ctypes.c_void_p], ctypes.Array[ctypes.c_void_p], ctypes.Array[ctypes.c_void_p]],
    source: tuple[int, ...],
    embed: torch.Tensor,
    scale: float,
    at: torch.Tensor,
    output: c_layers.LinearC,
    advance: BeamAdvance,
    tokens: torch.Tensor,
    pos: int,
    norms: torch.Tensor,
) -> tuple[int, BeamStep, torch.Tensor]:
    """csrc/beam_steps.c's beamserve_beam_steps: a beam search's steps pos, pos + 1, .. while every sentence goes on,
    each as decoder_layers (with `output`, the layers' structs and the source map checked by the caller:
    model/nn/c_step.py's one_call), then the BeamAdvance call, in one call, stopping after the first step at which a
    sentence is done or after at.shape[0] steps. embed (V, C) and at (steps, C), each step's sinusoid, float32
    contiguous; tokens (N,) int64 contiguous, every row's token at pos >= 1, replaced by the next step's where the
    call went on; norms (steps,) float32, each step's BeamAdvance norm. Returns the steps taken, the last one's
    BeamAdvance answer and its log-probabilities (N, V)."""
    b, K = advance.b, advance.K
    N, (V, C), steps = b * K, embed.shape, at.shape[0]
    native.check(
        tokens.dtype == torch.int64 and tokens.shape == (N,) and embed.dtype == at.dtype == norms.dtype == torch.float32
        and at.shape[1] == C and norms.shape == (steps,) and pos >= 1
        and all(t.is_contiguous() and t.is_cpu for t in (tokens, embed, at, norms)),
        "beam_steps", f"tokens ({N},) int64, embed (V, C), at (steps, C) and norms (steps,) float32, pos >= 1",
    )  # fmt: skip
    advance.check_vocabulary(output.N)
    x, logp, ran = torch.empty(N, C), torch.empty(N, output.N), (ctypes.c_int64 * 2)()
    src_beam, token, done, rows = found = advance.answer()
    layers, own, cross = (ctypes.cast(c, P) for c in chain)
    decoder = Decoder(
        layers,
        own,
        cross,
        len(chain[0]),
        c_layers.SourceMap(*source),
        embed.data_ptr(),
        V,
        C,
        scale,
        ctypes.pointer(output),
    )
    failed = native.kernels().beamserve_beam_steps(
        ctypes.byref(decoder),
        ctypes.byref(advance.beams),
        ctypes.byref(advance.rules),
        at.data_ptr(),
        norms.data_ptr(),
        tokens.data_ptr(),
        pos,
        steps,
        x.data_ptr(),
        logp.data_ptr(),
        ctypes.byref(BeamAnswer.into(found)),
        ran,
    )
    if failed == -3:
        raise IndexError(f"beam_steps: a token id outside the embedding's {V} rows")
    if failed == -4:  # the beam step's -2
        advance.check_answer(-2, output.N)
    c_layers.raise_sublayer(failed, "beam_steps")
    return ran[0], (src_beam, token, done, rows, ran[1]), logp


def _each(values: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    """values as n contiguous CPU values of dtype, or ValueError."""
    if not (values.dtype == dtype and values.numel() == n and values.is_contiguous() and values.device.type == "cpu"):
        raise ValueError(f"BeamAdvance: {n} contiguous {dtype} per sentence")
    return values
