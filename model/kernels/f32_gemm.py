"""Float32 GEMMs of a decode step's few rows in C (csrc/f32_gemm.c), wherever they give oneDNN's bits.

oneDNN's matmul (model/kernels/onednn.py) costs 40-50 us a call before any arithmetic: at batch 1 a step's
twenty-odd GEMMs spend most of their time there. The C kernel sums each output as oneDNN does on this
machine (fused multiply-adds in order of k within blocks of K, the blocks added in order, then the bias),
and is used only for a weight shape and intra-op thread count at which it was checked to give oneDNN's
bits, on random rows at every row count it serves (CHECK_ROWS): a sentence's translation stays the same
whichever computes it, alone or in a batch (oneDNN above most_rows: 64 rows, 256 for a weight of up to 2M
elements). Where they differ (another oneDNN build, a CPU whose blocking differs) oneDNN keeps every shape. An
activation fused in oneDNN's epilogue keeps oneDNN's call here (gemm.linear); a decode step made in one library
call (model/nn/c_step.py) computes a feed-forward's fc1 and its swish in C instead, with the C GEMM and
c_gemm.f32_swish_ (oneDNN's swish, step by step), where swish_agrees finds them giving oneDNN's fused bits at
fc1's shape.
"""

from __future__ import annotations

import logging

import torch

from model.kernels import c_gemm, native, onednn, ops

log = logging.getLogger(__name__)

MOST_ROWS = 64  # above this, oneDNN's call costs little beside its arithmetic
# A weight of at most WIDE_WEIGHT elements up to WIDE_ROWS: a decoder layer's at a batch of 64 sentences of 4 beams
# and an encoder's at a batch's tokens, so that those steps and encoders stay one call (docs/benchmarks.md). Not a
# larger weight (an output projection over a 58k vocabulary): checking it at such row counts takes seconds.
WIDE_ROWS, WIDE_WEIGHT = 256, 1 << 21
CHECK_ROWS = (1, 2, 3, 4, 5, 8, 13, 16, 33, 64, 97, 128, 256)
FORM_ATTR = "_beamserve_f32"  # on a weight: (its version, its packed form for the C kernel)
_AGREES: dict[tuple[int, int, int], bool] = {}
_SWISH_AGREES: dict[tuple[int, int, int], bool] = {}


def most_rows(N: int, K: int) -> int:
    """The most rows the C kernel serves for (N, K) weights, where it agrees: in the AVX2 build as in the AVX-512 one
    (its 8-lane kernel is level with oneDNN's AVX2 matmul at 64 rows and 0.9-1.0x at 256, and a step in one call
    saves more: docs/benchmarks.md, "The AVX2 build")."""
    return WIDE_ROWS if N * K <= WIDE_WEIGHT else MOST_ROWS


def agrees(N: int, K: int) -> bool:
    """Whether the C kernel gives oneDNN's bits for (N, K) weights at this intra-op thread count: checked on
    random weights, biases and rows at every row count of CHECK_ROWS it serves (most_rows), once per shape and
    thread count."""
    key = (N, K, torch.get_num_threads())
    found = _AGREES.get(key)
    if found is None:
        found = _AGREES[key] = _check(N, K)
        if not found and native.f32() and onednn.LINEAR is not None:  # built, and differing: not merely absent
            log.warning("float32 GEMM (%d x %d): the C kernel's sums differ from oneDNN's here; oneDNN keeps it", N, K)
    return found


def _check(N: int, K: int, post_op: str = "none") -> bool:
    if not native.f32() or onednn.LINEAR is None:
        return False
    gen = torch.Generator().manual_seed(N * 31 + K)
    with torch.inference_mode():
        w, b = torch.randn(N, K, generator=gen) * 0.05, torch.randn(N, generator=gen)
        form = c_gemm.F32Weight(w)
        for rows in (rows for rows in CHECK_ROWS if rows <= most_rows(N, K)):
            x = torch.randn(rows, K, generator=gen) * (1 + 4 * (rows % 2))  # activations far into swish's tails too
            for bias in (b, None):
                y = ops.f32_linear(x, form, bias)
                if post_op == "swish":
                    c_gemm.f32_swish_(y)
                if not torch.equal(y, onednn.linear(x, w, bias, post_op)):
                    return False
    return True


def swish_agrees(N: int, K: int) -> bool:
    """Whether the C kernel followed by c_gemm.f32_swish_ gives the bits of oneDNN's linear with its swish post-op
    for (N, K) weights at this intra-op thread count (as agrees checks the plain linear): the feed-forward's fc1
    of a float32 decode step, in C (model/nn/c_step.py)."""
    key = (N, K, torch.get_num_threads())
    found = _SWISH_AGREES.get(key)
    if found is None:
        found = _SWISH_AGREES[key] = agrees(N, K) and _check(N, K, "swish")
        if not found and native.f32() and onednn.LINEAR is not None:
            log.info("float32 GEMM (%d x %d) with swish: C's bits differ from oneDNN's, which runs it", N, K)
    return found


def form(weight: torch.Tensor) -> c_gemm.F32Weight | None:
    """weight's packed form for the C kernel (made once, redone when the weight changes), where the kernel
    agrees with oneDNN at its shape; None else."""
    held: tuple[int, c_gemm.F32Weight] | None = getattr(weight, FORM_ATTR, None)
    v = onednn.version(weight)
    if held is not None and held[0] == v:
        return held[1]
    if weight.dim() != 2 or not agrees(*weight.shape):
        return None
    with torch.inference_mode():
        made = c_gemm.F32Weight(weight.detach())
    setattr(weight, FORM_ATTR, (v, made))
    return made


def serving(weight: torch.Tensor, rows: int) -> c_gemm.F32Weight | None:
    """weight's form where the C kernel serves a call of `rows` rows: no more than most_rows, the kernel built
    here and giving oneDNN's bits at its shape; None else."""
    return form(weight) if weight.dim() == 2 and rows <= most_rows(*weight.shape) and native.f32() else None


def linear(
    rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None
) -> torch.Tensor | None:
    """rows (M, K) float32 @ weight^T + bias (+ residual, (M, N)) in C, oneDNN's bits; None where the C kernel
    does not serve (serving)."""
    made = serving(weight, rows.shape[0])
    return None if made is None else ops.f32_linear(rows, made, bias, residual)
