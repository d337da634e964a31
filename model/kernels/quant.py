"""int8 GEMMs for CPU inference, as CTranslate2's int8 compute type does them.

Each weight row has its own scale (quantised once, at load); each activation row gets its own scale,
computed on the fly from that row alone. The product of the two int8 matrices is exact in int32, and
each output element is then scaled by its row's and its column's scale, so a sentence's result never
depends on what it is batched with (a per-tensor activation scale, as PyTorch's dynamic quantisation
uses, would make it depend on the batch's largest value).

The GEMM is oneDNN's int8 matmul (`onednn::qlinear_pointwise`, with VNNI or AMX) on
a copy of the weight reordered once into oneDNN's blocked layout, with the column scales applied in its
epilogue: the product is exact in int32 and then scaled as one float multiply per element, so it equals
`torch._int_mm` (which reorders the weight on every call) times the column scales, to the bit, in 2-4x
less time on the decoder's shapes (`python loadtests/bench_gemm.py`). Builds without that op, and CPUs
where it is a reference loop rather than a JIT kernel (onednn_int8()), keep `torch._int_mm` on the (N, K)
weight's transposed view, as do CPUs where it is not exact (no VNNI or AMX: onednn_int8_computes()); on
CPU, where model/kernels/native.py has its kernels, that product is C's own (exact too: torch._int_mm on such
CPUs is 30x slower than a float32 GEMM). Quantising the activation rows, and scaling the product back,
run in C there too, to the same bits.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from model.decode.search import log_softmax_
from model.kernels import native

QMAX = 127.0  # symmetric int8: -127..127, so a row's scale maps its largest magnitude to 127


@dataclass(frozen=True)
class Int8Weight:
    """A (N, K) float weight as int8 rows and one scale per row: weight[n] ~= qweight[n] * scale[n]."""

    qweight: torch.Tensor  # (N, K) int8, contiguous
    scale: torch.Tensor  # (N,) float32
    packed: torch.Tensor | None = None  # qweight in oneDNN's blocked layout; None: torch._int_mm instead
    zero_points: torch.Tensor | None = None  # (N,) int64 zeros, as oneDNN's op takes them

    def dequantize(self) -> torch.Tensor:
        return self.qweight.float() * self.scale[:, None]  # (N, K)


@functools.cache
def onednn_int8_computes() -> bool:
    """Whether this build has oneDNN's int8 matmul and it computes the exact product. On x86 CPUs without
    VNNI or AMX (AMD's Zen 2 and 3, Intel's before Cascade Lake) oneDNN multiplies with AVX2's vpmaddubsw,
    which saturates each pair of products at 16 bits: 127 x 127 rows come out ~100x too small, and a
    row's result would depend on which kernel its batch's size picks. The probe is such rows."""
    try:
        x, w = torch.full((16, 256), 127, dtype=torch.int8), torch.full((8, 256), 127, dtype=torch.int8)
        probe = torch.ops.onednn.qlinear_prepack(w, None)
        y = torch.ops.onednn.qlinear_pointwise(
            x, 1.0, 0, probe, torch.ones(8), torch.zeros(8, dtype=torch.int64),
            None, 1.0, 0, torch.float32, "none", [], "",
        )  # fmt: skip
        return bool(torch.equal(y, torch.full((16, 8), 127.0 * 127.0 * 256)))  # exact in float32 (< 2^24)
    except (AttributeError, RuntimeError, NotImplementedError):  # a build or CPU without oneDNN's int8 path
        return False


@functools.cache
def onednn_int8() -> bool:
    """Whether int8 GEMMs take oneDNN's int8 matmul: it computes right here and is a real kernel. Where
    oneDNN's JIT does not serve the CPU (AMD's Zen 4 with PyTorch 2.13) the op falls back to a reference
    loop 1,000x slower than torch._int_mm, so it is timed against that on a 1M multiply-add product (~0.1 ms
    either way where both are real, ~20 ms for the loop). Asked at the first quantised weight, inside
    Translator.load's one thread: run at import, the probe would start an OpenMP team in the importing
    thread (model/translator.py says why a server must not have two)."""
    if not onednn_int8_computes():
        return False
    with torch.inference_mode():
        x, w = torch.ones(16, 256, dtype=torch.int8), torch.ones(256, 256, dtype=torch.int8)
        packed = torch.ops.onednn.qlinear_prepack(w, None)
        scale, zeros = torch.ones(256), torch.zeros(256, dtype=torch.int64)
        onednn = _best_s(lambda: torch.ops.onednn.qlinear_pointwise(
            x, 1.0, 0, packed, scale, zeros, None, 1.0, 0, torch.float32, "none", [], ""
        ))  # fmt: skip
        int_mm = _best_s(lambda: torch._int_mm(x, w.t()))
    # The absolute bound holds when other processes slow torch._int_mm's timing down: a real kernel does
    # the product in well under 2 ms on any CPU, the loop in no less.
    return onednn < 10 * int_mm + 1e-4 and onednn < REAL_KERNEL_S


REAL_KERNEL_S = 2e-3


def _best_s(fn: Callable[[], object], repeats: int = 3) -> float:
    fn()  # the first call builds the primitive
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


# oneDNN's op costs about 40 us a call before any arithmetic; torch._int_mm about 20 us plus a reorder of
# the weight. So oneDNN for large weights (the output projection, the feed-forward of d_model 512) and
# for many rows; _int_mm for the rest (`python loadtests/bench_gemm.py`). Both give the same bits.
ONEDNN_MIN_WEIGHT = 1 << 20  # N x K
ONEDNN_MIN_MACS = 1 << 25  # M x N x K


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w (R, C) float -> (R, C) int8 and (R, 1) float32 scales, each row on its own scale."""
    w = w.float()
    # amax and amin: two vectorised passes and no |w| copy (aminmax over a row is 10x slower on CPU)
    high, low = w.amax(-1, keepdim=True), w.amin(-1, keepdim=True)
    scale = torch.maximum(high, low.neg_()).clamp_min_(1e-12).div_(QMAX)  # (R, 1)
    return torch.div(w, scale).round_().to(torch.int8), scale


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_rows for a GEMM's activation rows x (M, K): in one pass where the C kernels are built."""
    if not native.quantizes():
        return quantize_rows(x)
    if x.dtype != torch.float32 or x.stride(-1) != 1:
        x = x.float().contiguous()
    return native.quantize_rows(x)


def quantize_weight(weight: torch.Tensor) -> Int8Weight:
    q, scale = quantize_rows(weight.detach())
    return int8_weight(q.contiguous(), scale.squeeze(1).contiguous())


def int8_weight(qweight: torch.Tensor, scale: torch.Tensor, onednn: bool | None = None) -> Int8Weight:
    """An int8 (N, K) weight and its (N,) row scales, packed for oneDNN where it runs (`onednn`; by
    default where onednn_int8())."""
    if qweight.device.type != "cpu" or not (onednn_int8() if onednn is None else onednn):
        return Int8Weight(qweight, scale)
    with torch.inference_mode():
        packed = torch.ops.onednn.qlinear_prepack(qweight, None)
    zeros = torch.zeros(qweight.shape[0], dtype=torch.int64)
    return Int8Weight(qweight, scale.float(), packed, zeros)


# Where a float weight keeps its int8 form (`use_int8`): on the weight itself, so the form lives and dies
# with it and each model of a pool replica has its own (not in the state dict: an attribute, no buffer).
INT8_ATTR = "_beamserve_int8"


def use_int8(weight: torch.Tensor, saved: Int8Weight | None = None) -> Int8Weight:
    """From now on `model.kernels.gemm.linear` multiplies by `weight` in int8 (on CPU, outside autograd): by
    `saved` where given (an int8 checkpoint's), else by `weight` quantised now."""
    found = int8_of(weight)
    if found is not None and saved is None:
        return found
    q = saved if saved is not None else quantize_weight(weight)
    setattr(weight, INT8_ATTR, q)
    return q


def int8_of(weight: torch.Tensor) -> Int8Weight | None:
    # getattr, not __dict__: torch.compile traces an attribute read (the static decode step's), not the dict
    found: Int8Weight | None = getattr(weight, INT8_ATTR, None)
    return found


def linear_int8(
    x: torch.Tensor, q: Int8Weight, bias: torch.Tensor | None = None, *, log_softmax: bool = False
) -> torch.Tensor:
    """x (..., K) @ weight^T + bias with int8 operands: x quantised per row, the int32 product scaled
    back per row and per column. Returns (..., N) in x's dtype; with `log_softmax`, each row's
    log-softmax (float32, model.decode.search.log_softmax_), in the scale-back's pass where the C kernels run."""
    lead, K = x.shape[:-1], x.shape[-1]
    xq, xs = quantize_activations(x.reshape(-1, K))  # (M, K) int8, (M, 1)
    if bias is not None and bias.dtype != torch.float32:  # a decode step makes ~20 calls: no needless ops
        bias = bias.float()
    M, N = xq.shape[0], q.qweight.shape[0]
    if q.packed is not None and (N * K >= ONEDNN_MIN_WEIGHT or M * N * K >= ONEDNN_MIN_MACS):
        if M == 1:  # oneDNN's one-row int8 primitive is 30-250x slower than its two-row one
            xq = torch.cat([xq, xq.new_zeros(1, K)])
        # (M, N) float32: the exact int32 product times the column scales, in oneDNN's epilogue
        y = torch.ops.onednn.qlinear_pointwise(
            xq, 1.0, 0, q.packed, q.scale, q.zero_points, None, 1.0, 0, torch.float32, "none", [], ""
        )[:M]
        # the row scales, and the bias after them, in one pass
        y = torch.addcmul(bias, y, xs, out=y) if bias is not None else y.mul_(xs)
        return _out(y.view(*lead, N), x.dtype, log_softmax)
    # (M, N) int32, exact; in C where oneDNN does not serve (no packed copy), as torch._int_mm is slow there
    in_c = q.packed is None and native.multiplies_int8(xq)
    acc = native.int8_gemm(xq, q.qweight) if in_c else torch._int_mm(xq, q.qweight.t())
    if log_softmax and native.scales_back() and native.runs_on(x):
        y = native.scale_back_log_softmax_(acc, q.scale, xs, bias)
        return y.view(*lead, N)
    if native.scales_back():  # one pass, over acc's own memory
        y = native.scale_back_(acc, q.scale, xs, bias)
    else:
        # (M, N) float32 with the column scales: a conversion, then an in-place product (a mixed-type
        # multiply converts into a copy first anyway, then allocates its result)
        y = acc.to(torch.float32).mul_(q.scale)
        y = torch.addcmul(bias, y, xs, out=y) if bias is not None else y.mul_(xs)
    return _out(y.view(*lead, N), x.dtype, log_softmax)


def _out(y: torch.Tensor, dtype: torch.dtype, log_softmax: bool) -> torch.Tensor:
    """y (float32) in x's dtype, then its log-softmax where asked (of the logits as that dtype has them)."""
    y = y if dtype == torch.float32 else y.to(dtype)
    return log_softmax_(y) if log_softmax else y
