"""The library's GEMMs and the passes around them (csrc/int8_rows.c, int8_vnni.c, int8_avx2.c, f32_gemm.c): weights
packed once (VnniWeight, F32Weight), int8 and float32 linear layers, the activation rows' quantisation and the
int32 products' scale-back, each with the checks of what it reads and writes (model/kernels/native.py's check)."""

from __future__ import annotations

import functools

import torch

from model.kernels import native


class F32Weight:
    """An (N, K) float32 weight packed for csrc/f32_gemm.c (panels of 16 columns), checked once, here."""

    __slots__ = ("K", "N", "packed")

    def __init__(self, w: torch.Tensor) -> None:
        lib = native.kernels()
        native.check(
            w.dtype == torch.float32 and w.dim() == 2 and w.device.type == "cpu", "f32_pack", "a 2-d float32 weight"
        )
        w = w.contiguous()
        self.N, self.K = w.shape
        self.packed = torch.empty(lib.beamserve_f32_packed_floats(self.N, self.K))
        lib.beamserve_f32_pack(w.data_ptr(), self.N, self.K, self.packed.data_ptr())

    @classmethod
    def of(cls, packed: torch.Tensor, N: int, K: int) -> F32Weight:
        """The weight an operator is handed as its packed floats and shape (model/kernels/ops.py), checked: a
        packed form of another size would have the kernel read past it."""
        if not (packed.dtype == torch.float32 and packed.is_contiguous() and packed.numel() == _f32_floats(N, K)):
            raise ValueError(f"f32_linear: a packed ({N}, {K}) float32 weight")
        made = cls.__new__(cls)
        made.N, made.K, made.packed = N, K, packed
        return made


@functools.lru_cache(maxsize=1024)
def _f32_floats(N: int, K: int) -> int:
    return int(native.kernels().beamserve_f32_packed_floats(N, K))


def _bias_and_residual(
    kernel: str, M: int, N: int, bias: torch.Tensor | None, residual: torch.Tensor | None
) -> tuple[int | None, int]:
    """What a linear kernel reads besides x and its weight, checked: N contiguous float32 biases, and an (M, N)
    float32 residual with unit column stride, as its address and row stride (None, 0 without one)."""
    if bias is not None and (bias.dtype != torch.float32 or bias.numel() != N or not bias.is_contiguous()):
        raise ValueError(f"{kernel}: the bias must be {N} contiguous float32s")
    if residual is None:
        return None, 0
    if residual.dtype != torch.float32 or residual.shape != (M, N) or residual.stride(1) != 1:
        raise ValueError(f"{kernel}: the residual must be ({M}, {N}) float32 with unit column stride")
    return residual.data_ptr(), residual.stride(0)


def f32_swish_(x: torch.Tensor) -> torch.Tensor:
    """x float32 contiguous on CPU replaced by swish(x) as oneDNN's swish post-op computes it (csrc/f32_gemm.c);
    returns x. Only where f32()."""
    native.check(
        x.dtype == torch.float32 and x.is_contiguous() and x.is_cpu, "f32_swish_", "x float32 contiguous on CPU"
    )
    native.raise_for(native.kernels().beamserve_f32_swish(x.data_ptr(), x.numel()), "f32_swish_")
    return x


def f32_linear(
    x: torch.Tensor, w: F32Weight, bias: torch.Tensor | None, residual: torch.Tensor | None = None
) -> torch.Tensor:
    """x (M, K) float32 @ w^T + bias (N,), plus residual (M, N) where given -> (M, N), summed as
    csrc/f32_gemm.c says. Only where f32()."""
    lib = native.kernels()
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != w.K or x.stride(1) != 1 or not x.is_cpu:
        raise ValueError(f"f32_linear: x must be (M, {w.K}) float32 on CPU with unit column stride")
    M, N = x.shape[0], w.N
    r, ldr = _bias_and_residual("f32_linear", M, N, bias, residual)
    y = torch.empty(M, N)
    failed = lib.beamserve_f32_linear(
        x.data_ptr(), M, w.K, x.stride(0), w.packed.data_ptr(), N, None if bias is None else bias.data_ptr(),
        r, ldr, y.data_ptr(), N,
    )  # fmt: skip
    if failed:
        raise RuntimeError("f32_linear: this build has no float32 kernel")
    return y


class VnniWeight:
    """An (N, K) int8 weight packed for the VNNI kernels, with its (N,) column scales: checked once, here, so
    that a call checks only what it is handed."""

    __slots__ = ("K", "N", "comp", "packed", "scale")

    def __init__(self, w: torch.Tensor, scale: torch.Tensor) -> None:
        lib = native.kernels()
        native.check(w.dtype == torch.int8 and w.dim() == 2, "vnni_pack", "a 2-d int8 weight")
        self.N, self.K = w.shape
        native.check(scale.dtype == torch.float32 and scale.numel() == self.N, "vnni_pack", f"{self.N} float32 scales")
        if native._PACKED == 1 and bool((w == -128).any()):  # csrc/int8_avx2.c negates weights: -128 has no negative
            raise ValueError("vnni_pack: the AVX2 kernel multiplies weights of -127..127, and this one holds -128")
        w = w.contiguous()
        self.packed = torch.empty(lib.beamserve_vnni_packed_bytes(self.N, self.K), dtype=torch.int8)
        self.comp = torch.empty(self.N, dtype=torch.int32)
        self.scale = scale.contiguous()
        lib.beamserve_vnni_pack(w.data_ptr(), self.N, self.K, self.packed.data_ptr(), self.comp.data_ptr())

    @classmethod
    def of(cls, packed: torch.Tensor, comp: torch.Tensor, scale: torch.Tensor, N: int, K: int) -> VnniWeight:
        """The weight an operator is handed as its packed bytes, column sums, scales (empty where the call reads
        none: vnni_gemm) and shape (model/kernels/ops.py), checked: a form of another size would have the kernel
        read past it."""
        if not (
            packed.dtype == torch.int8 and comp.dtype == torch.int32 and scale.dtype == torch.float32
            and packed.numel() == _vnni_bytes(N, K) and comp.numel() == N and scale.numel() in (0, N)
            and packed.is_contiguous() and comp.is_contiguous() and scale.is_contiguous()
        ):  # fmt: skip
            raise ValueError(f"vnni_pack: a packed ({N}, {K}) int8 weight, its {N} column sums and scales")
        made = cls.__new__(cls)
        made.N, made.K, made.packed, made.comp, made.scale = N, K, packed, comp, scale
        return made


@functools.lru_cache(maxsize=1024)
def _vnni_bytes(N: int, K: int) -> int:
    return int(native.kernels().beamserve_vnni_packed_bytes(N, K))


def vnni_gemm(x: torch.Tensor, w: VnniWeight) -> torch.Tensor:
    """x (M, K) int8 with unit column stride against a packed (N, K) weight -> x @ w^T, (M, N) int32, exact (as
    torch._int_mm). Only where vnni()."""
    lib = native.kernels()
    native.check(x.dtype == torch.int8 and x.dim() == 2 and x.stride(1) == 1, "vnni_gemm", "x (M, K) int8, unit stride")
    M, K = x.shape
    if K != w.K:
        raise ValueError(f"vnni_gemm: rows of {K} against a weight of {w.K} columns")
    y = torch.empty(M, w.N, dtype=torch.int32)
    failed = lib.beamserve_vnni_int8_gemm(
        x.data_ptr(), M, K, x.stride(0), w.packed.data_ptr(), w.comp.data_ptr(), w.N, y.data_ptr()
    )
    native.raise_for(failed, "vnni_gemm")
    return y


def vnni_linear(
    x: torch.Tensor,
    w: VnniWeight,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None = None,
    *,
    log_softmax: bool = False,
) -> torch.Tensor:
    """x (M, K) through an int8 linear layer in one call: each row quantised (quantize_rows), multiplied by the
    packed (N, K) weight, scaled back with its column scales and the bias (scale_back_), plus `residual` (M, N)
    float32 where given -> (M, N) float32, the bits of those steps in turn; with `log_softmax` (no residual),
    each row's log-softmax after (log_softmax_). Only where vnni()."""
    lib = native.kernels()
    if log_softmax and residual is not None:
        raise ValueError("vnni_linear: a residual or a log-softmax, not both")
    if x.dtype != torch.float32 or x.stride(-1) != 1:
        x = x.float().contiguous()
    if x.dim() != 2 or x.shape[1] != w.K or not x.is_cpu:
        raise ValueError(f"vnni_linear: x must be (M, {w.K}) on CPU, not {tuple(x.shape)} on {x.device}")
    M, N = x.shape[0], w.N
    native.check(w.scale.numel() == N, "vnni_linear", f"{N} column scales")
    r, ldr = _bias_and_residual("vnni_linear", M, N, bias, residual)
    y = torch.empty(M, N)
    failed = lib.beamserve_vnni_linear(
        x.data_ptr(), M, w.K, x.stride(0), w.packed.data_ptr(), w.comp.data_ptr(), N, w.scale.data_ptr(),
        None if bias is None else bias.data_ptr(), r, ldr, y.data_ptr(), N,
    )  # fmt: skip
    native.raise_for(failed, "vnni_linear")
    return native.log_softmax_(y) if log_softmax else y


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) float32 on CPU, unit column stride -> (M, K) int8 and (M, 1) float32 scales, as
    model.kernels.quant.quantize_rows computes them. Only where quantizes()."""
    lib = native.kernels()
    native.check(
        x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 2 and x.stride(1) == 1,
        "quantize_rows",
        "x must be (M, K) float32 on CPU with unit column stride",
    )
    M, K = x.shape
    q = torch.empty(M, K, dtype=torch.int8)
    scale = torch.empty(M, 1)
    lib.beamserve_quantize_rows(x.data_ptr(), M, K, x.stride(0), q.data_ptr(), scale.data_ptr())
    return q, scale


def _check_scales(
    acc: torch.Tensor, col_scale: torch.Tensor, row_scale: torch.Tensor, bias: torch.Tensor | None
) -> None:
    """What the scale-back kernels read: acc's M x N int32s, N column scales, M row scales, N biases."""
    M, N = acc.shape
    native.check(acc.dtype == torch.int32 and acc.is_contiguous(), "scale_back", "acc must be contiguous int32")
    native.check(col_scale.dtype == row_scale.dtype == torch.float32, "scale_back", "the scales must be float32")
    native.check(col_scale.is_contiguous() and row_scale.is_contiguous(), "scale_back", "the scales must be contiguous")
    native.check(col_scale.numel() == N and row_scale.numel() == M, "scale_back", f"scales for ({M}, {N})")
    _check_bias(bias, N, "scale_back")


def _check_bias(bias: torch.Tensor | None, N: int, kernel: str) -> None:
    """A kernel's bias: none, or N contiguous float32s."""
    native.check(
        bias is None or (bias.dtype == torch.float32 and bias.is_contiguous() and bias.numel() == N),
        kernel,
        f"the bias must be {N} contiguous float32s",
    )


def scale_back_(
    acc: torch.Tensor, col_scale: torch.Tensor, row_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """acc (M, N) contiguous int32 -> acc * col_scale (N,) * row_scale (M, 1) + bias (N,), float32, written
    over acc's own memory (returned as a float32 view of it). Only where scales_back()."""
    lib = native.kernels()
    M, N = acc.shape
    _check_scales(acc, col_scale, row_scale, bias)
    y = acc.view(torch.float32)
    b = None if bias is None else bias.data_ptr()
    lib.beamserve_scale_back(acc.data_ptr(), M, N, col_scale.data_ptr(), row_scale.data_ptr(), b, y.data_ptr())
    return y


def scale_back_log_softmax_(
    acc: torch.Tensor, col_scale: torch.Tensor, row_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """scale_back_, then log_softmax_ of each row, a row at a time (the row still in cache): the same bits as
    the two calls. Only where scales_back()."""
    lib = native.kernels()
    M, N = acc.shape
    _check_scales(acc, col_scale, row_scale, bias)
    y = acc.view(torch.float32)
    b = None if bias is None else bias.data_ptr()
    lib.beamserve_scale_back_log_softmax(
        acc.data_ptr(), M, N, col_scale.data_ptr(), row_scale.data_ptr(), b, y.data_ptr()
    )
    return y


def rescale_log_softmax_(y: torch.Tensor, row_scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """y (M, N) contiguous float32, a product times its column scales -> each row's log-softmax of y * row_scale
    (M, 1) + bias (N,), written over y: the same bits as torch.addcmul(bias, y, row_scale), then log_softmax_.
    Only where scales_back()."""
    M, N = y.shape
    native.check(
        y.dtype == row_scale.dtype == torch.float32 and y.is_contiguous() and row_scale.is_contiguous()
        and row_scale.numel() == M and all(t.device.type == "cpu" for t in (y, row_scale)),
        "rescale_log_softmax",
        "y (M, N) and row_scale (M, 1) contiguous float32 on CPU",
    )  # fmt: skip
    _check_bias(bias, N, "rescale_log_softmax")
    b = None if bias is None else bias.data_ptr()
    native.kernels().beamserve_rescale_log_softmax(y.data_ptr(), M, N, row_scale.data_ptr(), b)
    return y
