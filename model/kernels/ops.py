"""beamserve's C kernels as PyTorch operators (`torch.ops.beamserve.*`): each with its schema (what it reads, what
it writes in place), its CPU implementation (model/kernels/native.py: the checks, then the library's call) and a
fake implementation giving its results' shapes and dtypes, so torch.compile traces a model through them as
through ATen's ops, and `torch.library.opcheck` holds each to its schema (tests/test_ops.py).

The model calls the functions at the end of this module. Eagerly each runs native.py's function, the library's
call itself: through the dispatcher a call costs 2-8 us more, and a one-sentence int8 decode makes ~37 such calls
(3% of its time, int8 and float32, measured in one process against the direct calls: loadtests/bench_ops.py).
While torch.compile traces the model, each calls its operator, which the graph then holds.

These are the kernels whose arguments are tensors and numbers. The fused sublayer and beam-step calls of a decode
(c_layers.decoder_segment, encoder_segment, self_sublayer, cross_sublayer, linear_forward, BeamAdvance) read their
weights and caches through structs of pointers that a plan builds once per decode: no schema can say what they
read or write, so they stay ctypes calls, which torch.compile does not trace: a compiled model breaks its graph
there and runs them as eager does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import torch

from model.kernels import c_attention, c_gemm, c_layers, c_search, native

LIBRARY = torch.library.Library("beamserve", "DEF")  # type: ignore[no-untyped-call]  # the operators' namespace, held for the process

SCHEMAS = {
    "int8_gemm": "int8_gemm(Tensor x, Tensor w) -> Tensor",
    "quantize_rows": "quantize_rows(Tensor x) -> (Tensor, Tensor)",
    "scale_back_": "scale_back_(Tensor(a!) acc, Tensor col_scale, Tensor row_scale, Tensor? bias) -> ()",
    "scale_back_log_softmax_": (
        "scale_back_log_softmax_(Tensor(a!) acc, Tensor col_scale, Tensor row_scale, Tensor? bias) -> ()"
    ),
    "rescale_log_softmax_": "rescale_log_softmax_(Tensor(a!) y, Tensor row_scale, Tensor? bias) -> ()",
    "log_softmax_": "log_softmax_(Tensor(a!) x) -> ()",
    "vnni_gemm": "vnni_gemm(Tensor x, Tensor packed, Tensor comp, int N, int K) -> Tensor",
    "vnni_linear": (
        "vnni_linear(Tensor x, Tensor packed, Tensor comp, Tensor scale, int N, int K, Tensor? bias, "
        "Tensor? residual, bool log_softmax) -> Tensor"
    ),
    "f32_linear": "f32_linear(Tensor x, Tensor packed, int N, int K, Tensor? bias, Tensor? residual) -> Tensor",
    "attend": "attend(Tensor q, Tensor k, Tensor v, int length, Tensor? lengths, Tensor? rows) -> Tensor",
    "self_attend_step": (
        "self_attend_step(Tensor qkv, Tensor(a!) k, Tensor(b!) v, int at, Tensor? positions, Tensor(c!)? lineage)"
        " -> Tensor"
    ),
    "layer_norm": "layer_norm(Tensor x, Tensor weight, Tensor bias, float eps) -> Tensor",
    "embed": "embed(Tensor tokens, Tensor weight, float scale, Tensor at) -> Tensor",
    "top_candidates": "top_candidates(Tensor log_probs, Tensor run_scores, int n) -> (Tensor, Tensor, Tensor)",
    "beam_step": (
        "beam_step(Tensor log_probs, Tensor(a!) run_scores, Tensor(b!) run_tokens, Tensor(c!) fin_scores, "
        "Tensor(d!) fin_tokens, Tensor(e!) fin_flags, Tensor(f!) improvable, Tensor pos, Tensor max_lengths, "
        "Tensor norm, int eos, bool early_stopping) -> (Tensor, Tensor, Tensor)"
    ),
}


def _scale_back_(acc: torch.Tensor, col: torch.Tensor, row: torch.Tensor, bias: torch.Tensor | None) -> None:
    c_gemm.scale_back_(acc, col, row, bias)


def _scale_back_log_softmax_(
    acc: torch.Tensor, col: torch.Tensor, row: torch.Tensor, bias: torch.Tensor | None
) -> None:
    c_gemm.scale_back_log_softmax_(acc, col, row, bias)


def _rescale_log_softmax_(y: torch.Tensor, row: torch.Tensor, bias: torch.Tensor | None) -> None:
    c_gemm.rescale_log_softmax_(y, row, bias)


def _log_softmax_(x: torch.Tensor) -> None:
    native.log_softmax_(x)


def _vnni_gemm(x: torch.Tensor, packed: torch.Tensor, comp: torch.Tensor, N: int, K: int) -> torch.Tensor:
    return c_gemm.vnni_gemm(x, c_gemm.VnniWeight.of(packed, comp, torch.empty(0), N, K))


def _vnni_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    comp: torch.Tensor,
    scale: torch.Tensor,
    N: int,
    K: int,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    log_softmax: bool,
) -> torch.Tensor:
    w = c_gemm.VnniWeight.of(packed, comp, scale, N, K)
    return c_gemm.vnni_linear(x, w, bias, residual, log_softmax=log_softmax)


def _f32_linear(
    x: torch.Tensor, packed: torch.Tensor, N: int, K: int, bias: torch.Tensor | None, residual: torch.Tensor | None
) -> torch.Tensor:
    return c_gemm.f32_linear(x, c_gemm.F32Weight.of(packed, N, K), bias, residual)


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    length: int,
    lengths: torch.Tensor | None,
    rows: torch.Tensor | None,
) -> torch.Tensor:
    return c_attention.attend(q, k, v, length if lengths is None else lengths, rows)


def _self_attend_step(
    qkv: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    at: int,
    positions: torch.Tensor | None,
    lineage: torch.Tensor | None,
) -> torch.Tensor:
    return c_attention.self_attend_step(qkv, k, v, at if positions is None else positions, lineage)


def _beam_step(
    log_probs: torch.Tensor,
    run_scores: torch.Tensor,
    run_tokens: torch.Tensor,
    fin_scores: torch.Tensor,
    fin_tokens: torch.Tensor,
    fin_flags: torch.Tensor,
    improvable: torch.Tensor,
    pos: torch.Tensor,
    max_lengths: torch.Tensor,
    norm: torch.Tensor,
    eos: int,
    early_stopping: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    state = (run_scores, run_tokens, fin_scores, fin_tokens, fin_flags, improvable)
    return c_search.beam_step(log_probs, state, pos, max_lengths, norm, eos, early_stopping)


IMPLS: dict[str, Callable[..., object]] = {
    "int8_gemm": native.int8_gemm,
    "quantize_rows": c_gemm.quantize_rows,
    "scale_back_": _scale_back_,
    "scale_back_log_softmax_": _scale_back_log_softmax_,
    "rescale_log_softmax_": _rescale_log_softmax_,
    "log_softmax_": _log_softmax_,
    "vnni_gemm": _vnni_gemm,
    "vnni_linear": _vnni_linear,
    "f32_linear": _f32_linear,
    "attend": _attend,
    "self_attend_step": _self_attend_step,
    "layer_norm": native.layer_norm,
    "embed": c_layers.embed,
    "top_candidates": c_search.top_candidates,
    "beam_step": _beam_step,
}


# The fake implementations: each result's shape and dtype from the arguments' (no data read).


def _rows(x: torch.Tensor, N: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return x.new_empty(x.shape[0], N, dtype=dtype)


def _nothing(*_: object) -> None:
    return None


FAKES: dict[str, Callable[..., object]] = {
    "int8_gemm": lambda x, w: _rows(x, w.shape[0], torch.int32),
    "quantize_rows": lambda x: (x.new_empty(x.shape, dtype=torch.int8), x.new_empty(x.shape[0], 1)),
    "scale_back_": _nothing,
    "scale_back_log_softmax_": _nothing,
    "rescale_log_softmax_": _nothing,
    "log_softmax_": _nothing,
    "vnni_gemm": lambda x, packed, comp, N, K: _rows(x, N, torch.int32),
    "vnni_linear": lambda x, packed, comp, scale, N, K, bias, residual, log_softmax: _rows(x, N),
    "f32_linear": lambda x, packed, N, K, bias, residual: _rows(x, N),
    "attend": lambda q, k, v, length, lengths, rows: q.new_empty(q.shape),
    "self_attend_step": lambda qkv, k, v, at, positions, lineage: qkv.new_empty(qkv.shape[0], k.shape[1], k.shape[3]),
    "layer_norm": lambda x, weight, bias, eps: x.new_empty(x.shape),
    "embed": lambda tokens, weight, scale, at: weight.new_empty(tokens.numel(), weight.shape[1]),
    "top_candidates": lambda log_probs, run_scores, n: (
        log_probs.new_empty(log_probs.shape[0], n),
        log_probs.new_empty(log_probs.shape[0], n, dtype=torch.int64),
        log_probs.new_empty(log_probs.shape[0], n, dtype=torch.int64),
    ),
    "beam_step": lambda log_probs, *rest: (
        log_probs.new_empty(log_probs.shape[:2], dtype=torch.int64),
        log_probs.new_empty(log_probs.shape[:2], dtype=torch.int64),
        log_probs.new_empty(log_probs.shape[0], dtype=torch.bool),
    ),
}

for _name, _schema in SCHEMAS.items():
    LIBRARY.define(_schema)  # type: ignore[no-untyped-call]
    LIBRARY.impl(_name, IMPLS[_name], "CPU")  # type: ignore[no-untyped-call]
    torch.library.register_fake(f"beamserve::{_name}", FAKES[_name], lib=LIBRARY)

_OPS = torch.ops.beamserve


class Traced:
    """Each kernel's call through its operator, with native.py's function's arguments (which say what it computes
    and checks): what the model calls while torch.compile traces it."""

    @staticmethod
    def int8_gemm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return _OPS.int8_gemm.default(x, w)

    @staticmethod
    def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _OPS.quantize_rows.default(x)

    @staticmethod
    def scale_back_(
        acc: torch.Tensor, col_scale: torch.Tensor, row_scale: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        _OPS.scale_back_.default(acc, col_scale, row_scale, bias)
        return acc.view(torch.float32)

    @staticmethod
    def scale_back_log_softmax_(
        acc: torch.Tensor, col_scale: torch.Tensor, row_scale: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        _OPS.scale_back_log_softmax_.default(acc, col_scale, row_scale, bias)
        return acc.view(torch.float32)

    @staticmethod
    def rescale_log_softmax_(y: torch.Tensor, row_scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        _OPS.rescale_log_softmax_.default(y, row_scale, bias)
        return y

    @staticmethod
    def log_softmax_(x: torch.Tensor) -> torch.Tensor:
        _OPS.log_softmax_.default(x)
        return x

    @staticmethod
    def vnni_gemm(x: torch.Tensor, w: c_gemm.VnniWeight) -> torch.Tensor:
        return _OPS.vnni_gemm.default(x, w.packed, w.comp, w.N, w.K)

    @staticmethod
    def vnni_linear(
        x: torch.Tensor,
        w: c_gemm.VnniWeight,
        bias: torch.Tensor | None,
        residual: torch.Tensor | None = None,
        *,
        log_softmax: bool = False,
    ) -> torch.Tensor:
        return _OPS.vnni_linear.default(x, w.packed, w.comp, w.scale, w.N, w.K, bias, residual, log_softmax)

    @staticmethod
    def f32_linear(
        x: torch.Tensor, w: c_gemm.F32Weight, bias: torch.Tensor | None, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        return _OPS.f32_linear.default(x, w.packed, w.N, w.K, bias, residual)

    @staticmethod
    def attend(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, length: int | torch.Tensor, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        if isinstance(length, int):
            return _OPS.attend.default(q, k, v, length, None, rows)
        return _OPS.attend.default(q, k, v, 0, length, rows)

    @staticmethod
    def self_attend_step(
        qkv: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: int | torch.Tensor, lineage: torch.Tensor | None
    ) -> torch.Tensor:
        if isinstance(pos, int):
            return _OPS.self_attend_step.default(qkv, k, v, pos, None, lineage)
        return _OPS.self_attend_step.default(qkv, k, v, 0, pos, lineage)

    @staticmethod
    def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        return _OPS.layer_norm.default(x, weight, bias, eps)

    @staticmethod
    def embed(tokens: torch.Tensor, weight: torch.Tensor, scale: float, at: torch.Tensor) -> torch.Tensor:
        return _OPS.embed.default(tokens, weight, scale, at)

    @staticmethod
    def top_candidates(
        log_probs: torch.Tensor, run_scores: torch.Tensor, n: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return _OPS.top_candidates.default(log_probs, run_scores, n)

    @staticmethod
    def beam_step(
        log_probs: torch.Tensor,
        state: tuple[torch.Tensor, ...],
        pos: torch.Tensor,
        max_lengths: torch.Tensor,
        norm: torch.Tensor,
        eos: int,
        early_stopping: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return _OPS.beam_step.default(log_probs, *state, pos, max_lengths, norm, eos, early_stopping)


P = ParamSpec("P")
R = TypeVar("R")


def _routed(eager: Callable[P, R], traced: Callable[P, R]) -> Callable[P, R]:
    """The call the model makes: `eager` (native.py's function, the library's call) when eager, `traced` (its
    operator) while torch.compile traces. Through the dispatcher a call costs 2-8 us more, 3% of a one-sentence
    decode (loadtests/bench_ops.py). (torch.compiler.substitute_in_graph would say the same without a branch,
    but registering it imports torch._dynamo: a second of CPU on every model load.)"""

    @functools.wraps(eager)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        return traced(*args, **kwargs) if torch.compiler.is_compiling() else eager(*args, **kwargs)

    return call


int8_gemm = _routed(native.int8_gemm, Traced.int8_gemm)
quantize_rows = _routed(c_gemm.quantize_rows, Traced.quantize_rows)
scale_back_ = _routed(c_gemm.scale_back_, Traced.scale_back_)
scale_back_log_softmax_ = _routed(c_gemm.scale_back_log_softmax_, Traced.scale_back_log_softmax_)
rescale_log_softmax_ = _routed(c_gemm.rescale_log_softmax_, Traced.rescale_log_softmax_)
log_softmax_ = _routed(native.log_softmax_, Traced.log_softmax_)
vnni_gemm = _routed(c_gemm.vnni_gemm, Traced.vnni_gemm)
vnni_linear = _routed(c_gemm.vnni_linear, Traced.vnni_linear)
f32_linear = _routed(c_gemm.f32_linear, Traced.f32_linear)
attend = _routed(c_attention.attend, Traced.attend)
self_attend_step = _routed(c_attention.self_attend_step, Traced.self_attend_step)
layer_norm = _routed(native.layer_norm, Traced.layer_norm)
embed = _routed(c_layers.embed, Traced.embed)
top_candidates = _routed(c_search.top_candidates, Traced.top_candidates)
beam_step = _routed(c_search.beam_step, Traced.beam_step)
