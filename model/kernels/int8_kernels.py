"""The exact int8 GEMMs a CPU may have, each as a whole int8 linear layer: the activation rows quantised on their
own scales, the exact int32 product with the weight's int8 rows, and the product scaled back per row and per
column (model/kernels/quant.py). Every kernel gives the same bits; which is fastest depends on the CPU and the
shape, so model/kernels/int8_choice.py measures them at load.

    vnni     C, AVX-512 VNNI (Intel since Cascade Lake, AMD since Zen 4), or AVX2's exact pair products where the
             CPU has no VNNI (csrc/int8_avx2.c): one call, quantisation and scale-back fused, over a weight packed
             once (csrc/int8_vnni.c); the fastest at decoding's few rows
    onednn   oneDNN's int8 matmul over a weight reordered once into its blocked layout, the column scales in
             its epilogue; exact only with VNNI or AMX, and on AMD's Zen 4 (PyTorch 2.13) a reference loop
    int_mm   torch._int_mm over the (N, K) weight's transposed view: oneDNN's int8 GEMM where the CPU has
             VNNI, a slow loop elsewhere
    c        C, 16-bit products summed in 32 bits (csrc/int8_gemm.c): exact on every x86 CPU, AVX2's pace

The passes around a product that is not fused (quantising the rows, scaling back) run in C where the library
is built (model/kernels/native.py), to the same bits as PyTorch's ops.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import torch
from torch import nn

from model.kernels import c_gemm, native, ops

QMAX = 127.0  # symmetric int8: -127..127, so a row's scale maps its largest magnitude to 127
KERNELS = ("vnni", "onednn", "int_mm", "c")


class Int8Weight(nn.Module):
    """A (N, K) float weight as int8 rows and one scale per row, weight[n] ~= qweight[n] * scale[n], with the
    packed forms its kernels read and which kernel multiplies a call's rows (`plan`, int8_choice.ROWS).

    A module of the layer whose weight it stands for (model/kernels/quant.py: `use_int8`), its tensors buffers
    that no state dict holds (the layer's checkpoint entry is its float weight; an int8 checkpoint is written by
    model/io/checkpoint.py's save_int8). oneDNN's reordered weight is an opaque tensor of oneDNN's, kept as an
    attribute."""

    qweight: torch.Tensor  # (N, K) int8, contiguous
    scale: torch.Tensor  # (N,) float32

    def __init__(
        self,
        qweight: torch.Tensor,
        scale: torch.Tensor,
        plan: tuple[str, ...] = ("int_mm",),
        onednn: tuple[torch.Tensor, torch.Tensor] | None = None,
        vnni: c_gemm.VnniWeight | None = None,
    ) -> None:
        super().__init__()
        self.register_buffer("qweight", qweight, persistent=False)
        self.register_buffer("scale", scale, persistent=False)
        self.plan = plan  # the kernel for each row bucket (int8_choice.bucket); the last for more
        self.onednn = onednn  # qweight in oneDNN's blocked layout, (N,) int64 zeros
        self.vnni = vnni  # packed for csrc/int8_vnni.c: its tensors are this module's buffers too
        if vnni is not None:
            self.register_buffer("vnni_packed", vnni.packed, persistent=False)
            self.register_buffer("vnni_comp", vnni.comp, persistent=False)
        self._mirror()

    def _mirror(self) -> None:
        """The buffers as plain attributes too: reading a buffer through nn.Module's attribute lookup costs ~0.7 us
        (0.05 for an attribute), and an int8 decode step reads them a few hundred times on CPUs without VNNI."""
        self.__dict__.update(self._buffers)
        if self.vnni is not None:
            packed, comp = self.__dict__["vnni_packed"], self.__dict__["vnni_comp"]
            self.vnni = c_gemm.VnniWeight.of(packed, comp, self.scale, self.vnni.N, self.vnni.K)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Int8Weight:
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]  # new buffers (.to): the attributes follow
        self._mirror()
        return self

    def dequantize(self) -> torch.Tensor:
        return self.qweight.float() * self.scale[:, None]  # (N, K)

    def extra_repr(self) -> str:
        return f"{self.qweight.shape[0]}, {self.qweight.shape[1]}, plan={self.plan}"


def with_forms(qweight: torch.Tensor, scale: torch.Tensor, plan: tuple[str, ...]) -> Int8Weight:
    """The weight with the packed forms the kernels of `plan` read, each made once here (a kernel whose form is
    missing, as where the C kernels are turned off, gives way to torch._int_mm)."""
    onednn = vnni = None
    if "onednn" in plan:
        with torch.inference_mode():
            onednn = (torch.ops.onednn.qlinear_prepack(qweight, None), torch.zeros(qweight.shape[0], dtype=torch.int64))
    if "vnni" in plan and native.vnni():
        try:
            vnni = c_gemm.VnniWeight(qweight, scale.float())
        except ValueError:  # a weight the AVX2 kernel cannot multiply exactly (a -128): the 16-bit C kernel can
            plan = tuple("c" if k == "vnni" else k for k in plan)
    return Int8Weight(qweight, scale.float(), plan, onednn, vnni)


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
    return ops.quantize_rows(x)


def multiply(
    kernel: str,
    x: torch.Tensor,
    q: Int8Weight,
    bias: torch.Tensor | None,
    log_softmax: bool,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """x (M, K) @ weight^T + bias by `kernel`, plus residual (M, N) float32 where given, (M, N) float32; with
    `log_softmax` (no residual), each row's log-softmax in C (native.log_softmax_), where the caller has checked
    native.runs_on(x)."""
    if kernel == "vnni" and q.vnni is not None and native.vnni():
        return ops.vnni_linear(x, q.vnni, bias, residual, log_softmax=log_softmax)
    y = _product(kernel, x, q, bias, log_softmax)
    return y if residual is None else y.add_(residual)  # y + residual: the same rounding either way round


def _product(kernel: str, x: torch.Tensor, q: Int8Weight, bias: torch.Tensor | None, log_softmax: bool) -> torch.Tensor:
    xq, xs = quantize_activations(x)  # (M, K) int8, (M, 1)
    M, K = xq.shape
    if kernel == "onednn" and q.onednn is not None:
        if M == 1:  # oneDNN's one-row int8 primitive is 30-250x slower than its two-row one
            xq = torch.cat([xq, xq.new_zeros(1, K)])
        packed, zeros = q.onednn
        # (M, N) float32: the exact int32 product times the column scales, in oneDNN's epilogue
        y = torch.ops.onednn.qlinear_pointwise(
            xq, 1.0, 0, packed, q.scale, zeros, None, 1.0, 0, torch.float32, "none", [], ""
        )[:M]
        if log_softmax and native.scales_back():  # the row scales, the bias and the log-softmax in one pass
            return ops.rescale_log_softmax_(y, xs, bias)
        y = torch.addcmul(bias, y, xs, out=y) if bias is not None else y.mul_(xs)  # the row scales, then the bias
        return ops.log_softmax_(y) if log_softmax else y
    # (M, N) int32, exact
    acc = ops.int8_gemm(xq, q.qweight) if kernel == "c" and native.multiplies_int8(xq) else _int_mm(xq, q.qweight)
    if log_softmax:
        return ops.scale_back_log_softmax_(acc, q.scale, xs, bias)
    if native.scales_back():  # one pass, over acc's own memory
        return ops.scale_back_(acc, q.scale, xs, bias)
    # (M, N) float32 with the column scales: a conversion, then an in-place product (a mixed-type multiply
    # converts into a copy first anyway, then allocates its result)
    y = acc.to(torch.float32).mul_(q.scale)
    return torch.addcmul(bias, y, xs, out=y) if bias is not None else y.mul_(xs)


def _int_mm(xq: torch.Tensor, qweight: torch.Tensor) -> torch.Tensor:
    return torch._int_mm(xq, qweight.t())


@functools.cache
def exact(kernel: str) -> bool:
    """Whether `kernel` runs here and computes the exact product: on rows of 127s (where 16-bit pair sums would
    saturate, as AVX2's vpmaddubsw does) and of random values, against the product in int64."""
    if kernel == "onednn":
        return onednn_int8()
    if (kernel == "vnni" and not native.vnni()) or (kernel == "c" and not native.built()):
        return False
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(-127, 128, (8, 256), generator=gen).to(torch.int8)
    w = torch.randint(-127, 128, (32, 256), generator=gen).to(torch.int8)
    x[:2], w[:8] = 127, 127
    want = (x.long() @ w.long().t()).int()
    try:
        if kernel == "vnni":
            got = ops.vnni_gemm(x, c_gemm.VnniWeight(w, torch.ones(w.shape[0])))
        elif kernel == "c":
            got = ops.int8_gemm(x, w)
        else:
            got = _int_mm(x, w)
    except (RuntimeError, NotImplementedError):
        return False
    return bool(torch.equal(got, want))


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
    """Whether oneDNN's int8 matmul computes right here and is a real kernel. Where oneDNN's JIT does not
    serve the CPU (AMD's Zen 4 with PyTorch 2.13: `ONEDNN_VERBOSE=1` shows ref_int8) the op falls back to a
    reference loop 1,000x slower than torch._int_mm, which int8_choice would spend seconds timing at the
    shapes of a model; so it is timed against torch._int_mm on a 1M multiply-add product first (~0.1 ms either
    way where both are real, ~20 ms for the loop)."""
    if not onednn_int8_computes():
        return False
    with torch.inference_mode():
        x, w = torch.ones(16, 256, dtype=torch.int8), torch.ones(256, 256, dtype=torch.int8)
        packed = torch.ops.onednn.qlinear_prepack(w, None)
        scale, zeros = torch.ones(256), torch.zeros(256, dtype=torch.int64)
        onednn = best_seconds(lambda: torch.ops.onednn.qlinear_pointwise(
            x, 1.0, 0, packed, scale, zeros, None, 1.0, 0, torch.float32, "none", [], ""
        ))  # fmt: skip
        int_mm = best_seconds(lambda: torch._int_mm(x, w.t()))
    # The absolute bound holds when other processes slow torch._int_mm's timing down: a real kernel does
    # the product in well under 2 ms on any CPU, the loop in no less.
    return onednn < 10 * int_mm + 1e-4 and onednn < REAL_KERNEL_S


REAL_KERNEL_S = 2e-3


def best_seconds(fn: Callable[[], object], repeats: int = 3, *, least_s: float = 0.0) -> float:
    """The least time of `repeats` calls of fn (more, up to 100, until they take `least_s` in all), after one
    untimed call (which builds what it caches)."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    best = float("inf")
    for _ in range(max(repeats, min(100, int(least_s / max(first, 1e-7))))):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best
