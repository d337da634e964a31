"""beamserve's C kernels (model/kernels/csrc), where the package was built with them: the int8 GEMMs and the passes
around them, and a decode step's attention, log-softmax and candidate ranking.

An int8 GEMM (model/kernels/int8_kernels.py) is wrapped in per-row passes: quantising the activation rows, and
scaling the int32 product back per row and per column with the bias. In PyTorch's ops they are eight and three
passes over memory, each a call of its own; the C kernels do each in one pass and give the same bits
(tests/test_native.py). With AVX-512 VNNI or AVX2 the whole layer is one call over a weight packed once
(csrc/int8_vnni.c: quantisation, product and scale-back; with AMX, whole blocks of 16 rows through its tiles;
csrc/int8_avx2.c the same with AVX2's exact pair products); elsewhere C multiplies with 16-bit products
(csrc/int8_gemm.c), exact on every x86 CPU. model/kernels/int8_choice.py measures which kernel is fastest here.

A decode step's attention (csrc/attention.c: every row's query against its cached keys and values in
one pass) and log-softmax (csrc/search.c) compute their own bits, the same on every CPU, vector width
and batch, within float32 rounding of PyTorch's; a model that decodes with them says so in its digest
(Translator.digest), as its scores differ in the last bits from a replica's without the library. The
candidate ranking (csrc/search.c) gives search.top_candidates's exact answer in one pass.

`pip install` compiles the library (setup.py; without a C compiler the install goes on without it and says
so), on x86-64 each kernel once per level in the one library: the baseline (SSE2), x86-64-v3 (AVX2) and
x86-64-v4 (AVX-512); the library says which this CPU runs (csrc/dispatch.c) and that level's functions are
bound (`Kernels`). BEAMSERVE_NATIVE_KERNELS=0 turns it off; =x86-64-v3 (or another level) binds the level a
CPU of that level would, to measure it. The kernels run on the calling thread: a one-thread pass
still beats PyTorch's passes spread over threads (docs/benchmarks.md, "Compute types on CPU").
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch

from model.kernels.bindings import ENV, MODULE, Kernels, load

_LOADED = load()
_LIB = _LOADED
LEVEL = None if _LOADED is None else _LOADED.level  # the x86-64 level of the kernels bound (1: the baseline)
# Which kernels beat PyTorch's vectorised operators on this CPU: a kernel the compiler leaves scalar here
# (the quantisation without AVX-512, the scale-back without a vector fused multiply-add) would be slower.
_VECTORISED = _LIB.beamserve_vectorised() if _LIB is not None else 0
_PACKED = _LIB.beamserve_vnni() if _LIB is not None else 0  # 2: AVX-512 VNNI, 3: AVX-VNNI, 1: AVX2 alone, 0: none
_F32 = _LIB is not None and bool(_LIB.beamserve_f32_gemm())


def in_use() -> str:
    """The kernels this process computes with, for a person: the build and its x86-64 level, or why none."""
    if _LIB is None:
        if os.environ.get(ENV) == "0":
            return f"none ({ENV}=0)"
        return "none (turned off)" if _LOADED is not None else "none (not built: the install had no C compiler)"
    return f"{MODULE} ({'baseline' if LEVEL == 1 else f'x86-64-v{LEVEL}'})"


def turn_off() -> None:
    """From now on the model computes with PyTorch's ops only (side-by-side measurements, tests)."""
    global _LIB
    _LIB = None


def built() -> bool:
    """Whether the library is built and loaded (and not turned off), whatever this CPU runs of it."""
    return _LIB is not None


def available() -> bool:
    """Whether any int8 C kernel runs here (built, loadable, not turned off, vectorised on this CPU)."""
    return quantizes() or scales_back()


def multiplies_int8(x: torch.Tensor) -> bool:
    """Whether int8_gemm takes x: the library is loaded, x on CPU (torch.compile traces the kernels as the
    operators of model/kernels/ops.py)."""
    return _LIB is not None and x.device.type == "cpu"


def runs_on(x: torch.Tensor) -> bool:
    """Whether the decode-step kernels take x: where multiplies_int8(x), and x float32."""
    return x.dtype == torch.float32 and multiplies_int8(x)


def quantizes() -> bool:
    """Whether quantize_rows runs here."""
    return _LIB is not None and bool(_VECTORISED & 1)


def scales_back() -> bool:
    """Whether scale_back_ runs here."""
    return _LIB is not None and bool(_VECTORISED & 2)


def _lib() -> Kernels:
    if _LIB is None:
        raise RuntimeError("the C kernels are not loaded")
    return _LIB


def _check(holds: bool, kernel: str, what: str) -> None:
    """What a kernel will read or write is what the call hands it: checked here, not by `assert` (which
    `python -O` strips), as a wrong size would touch another tensor's memory."""
    if not holds:
        raise ValueError(f"{kernel}: {what}")


def int8_gemm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (M, K) int8 with unit column stride, w (N, K) int8 contiguous -> x @ w^T, (M, N) int32, exact (as
    torch._int_mm). Only where multiplies_int8(x)."""
    lib = _lib()
    _check(x.dtype == w.dtype == torch.int8 and x.dim() == w.dim() == 2, "int8_gemm", "two 2-d int8 tensors")
    (M, K), N = x.shape, w.shape[0]
    _check(
        w.shape[1] == K and x.stride(1) == 1 and (M == 1 or x.stride(0) >= K) and w.is_contiguous(),
        "int8_gemm",
        f"({M}, {K}) rows with strides {x.stride()} against a {tuple(w.shape)} weight",
    )
    y = torch.empty(M, N, dtype=torch.int32)
    lib.beamserve_int8_gemm(x.data_ptr(), M, K, x.stride(0), w.data_ptr(), N, y.data_ptr())
    return y


def vnni() -> bool:
    """Whether the packed int8 kernels (csrc/int8_vnni.c) run here: the build has them and the CPU has AVX-512
    VNNI, or AVX2 (csrc/int8_avx2.c multiplies the packed weight then, with AVX-VNNI where the CPU has it)."""
    return _LIB is not None and _PACKED > 0


def vnni_isa() -> str:
    """The instructions the packed int8 kernels multiply with here: "avx512-vnni", "avx-vnni", "avx2" or "" (none
    run)."""
    return {2: "avx512-vnni", 3: "avx-vnni", 1: "avx2"}.get(_PACKED, "") if _LIB is not None else ""


def allow_avx_vnni(allowed: bool) -> None:
    """The packed int8 kernels multiply with AVX-VNNI where the CPU has it (True, the default but under
    BEAMSERVE_NATIVE_KERNELS=x86-64-v3), or with AVX2's products alone (False), for a side-by-side measurement;
    no other build's kernels change. A weight packed since with AVX-VNNI may hold -128, which AVX2's do not take."""
    global _PACKED
    if _LIB is not None:
        _LIB.beamserve_avx_vnni_allow(int(allowed))
        _PACKED = _LIB.beamserve_vnni()


def amx() -> bool:
    """Whether the packed kernels multiply whole blocks of 16 rows with AMX tiles here (csrc/int8_vnni.c: the CPU has
    AMX-INT8 and Linux lends the process its tile registers): the same exact sums, several times as many a cycle."""
    return vnni() and bool(_lib().beamserve_vnni_amx())


def f32() -> bool:
    """Whether the float32 GEMM (csrc/f32_gemm.c) runs here: the build has it (AVX-512, or AVX2 with FMA)."""
    return _LIB is not None and _F32


class F32Weight:
    """An (N, K) float32 weight packed for csrc/f32_gemm.c (panels of 16 columns), checked once, here."""

    __slots__ = ("K", "N", "packed")

    def __init__(self, w: torch.Tensor) -> None:
        lib = _lib()
        _check(w.dtype == torch.float32 and w.dim() == 2 and w.device.type == "cpu", "f32_pack", "a 2-d float32 weight")
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
    return int(_lib().beamserve_f32_packed_floats(N, K))


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
    _check(x.dtype == torch.float32 and x.is_contiguous() and x.is_cpu, "f32_swish_", "x float32 contiguous on CPU")
    _raise_for(_lib().beamserve_f32_swish(x.data_ptr(), x.numel()), "f32_swish_")
    return x


def f32_linear(
    x: torch.Tensor, w: F32Weight, bias: torch.Tensor | None, residual: torch.Tensor | None = None
) -> torch.Tensor:
    """x (M, K) float32 @ w^T + bias (N,), plus residual (M, N) where given -> (M, N), summed as
    csrc/f32_gemm.c says. Only where f32()."""
    lib = _lib()
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
        lib = _lib()
        _check(w.dtype == torch.int8 and w.dim() == 2, "vnni_pack", "a 2-d int8 weight")
        self.N, self.K = w.shape
        _check(scale.dtype == torch.float32 and scale.numel() == self.N, "vnni_pack", f"{self.N} float32 scales")
        if _PACKED == 1 and bool((w == -128).any()):  # csrc/int8_avx2.c negates weights: -128 has no negative
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
    return int(_lib().beamserve_vnni_packed_bytes(N, K))


def vnni_gemm(x: torch.Tensor, w: VnniWeight) -> torch.Tensor:
    """x (M, K) int8 with unit column stride against a packed (N, K) weight -> x @ w^T, (M, N) int32, exact (as
    torch._int_mm). Only where vnni()."""
    lib = _lib()
    _check(x.dtype == torch.int8 and x.dim() == 2 and x.stride(1) == 1, "vnni_gemm", "x (M, K) int8, unit stride")
    M, K = x.shape
    if K != w.K:
        raise ValueError(f"vnni_gemm: rows of {K} against a weight of {w.K} columns")
    y = torch.empty(M, w.N, dtype=torch.int32)
    failed = lib.beamserve_vnni_int8_gemm(
        x.data_ptr(), M, K, x.stride(0), w.packed.data_ptr(), w.comp.data_ptr(), w.N, y.data_ptr()
    )
    _raise_for(failed, "vnni_gemm")
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
    lib = _lib()
    if log_softmax and residual is not None:
        raise ValueError("vnni_linear: a residual or a log-softmax, not both")
    if x.dtype != torch.float32 or x.stride(-1) != 1:
        x = x.float().contiguous()
    if x.dim() != 2 or x.shape[1] != w.K or not x.is_cpu:
        raise ValueError(f"vnni_linear: x must be (M, {w.K}) on CPU, not {tuple(x.shape)} on {x.device}")
    M, N = x.shape[0], w.N
    _check(w.scale.numel() == N, "vnni_linear", f"{N} column scales")
    r, ldr = _bias_and_residual("vnni_linear", M, N, bias, residual)
    y = torch.empty(M, N)
    failed = lib.beamserve_vnni_linear(
        x.data_ptr(), M, w.K, x.stride(0), w.packed.data_ptr(), w.comp.data_ptr(), N, w.scale.data_ptr(),
        None if bias is None else bias.data_ptr(), r, ldr, y.data_ptr(), N,
    )  # fmt: skip
    _raise_for(failed, "vnni_linear")
    return log_softmax_(y) if log_softmax else y


def _raise_for(failed: int, kernel: str) -> None:
    if failed == -1:
        raise RuntimeError(
            f"{kernel}: this build or CPU has no such kernel (AVX-512 VNNI for int8, AVX-512 for float32)"
        )
    if failed:
        raise MemoryError(f"{kernel}: no memory for the quantised rows")


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) float32 on CPU, unit column stride -> (M, K) int8 and (M, 1) float32 scales, as
    model.kernels.quant.quantize_rows computes them. Only where quantizes()."""
    lib = _lib()
    _check(
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
    _check(acc.dtype == torch.int32 and acc.is_contiguous(), "scale_back", "acc must be contiguous int32")
    _check(col_scale.dtype == row_scale.dtype == torch.float32, "scale_back", "the scales must be float32")
    _check(col_scale.is_contiguous() and row_scale.is_contiguous(), "scale_back", "the scales must be contiguous")
    _check(col_scale.numel() == N and row_scale.numel() == M, "scale_back", f"scales for ({M}, {N})")
    _check_bias(bias, N, "scale_back")


def _check_bias(bias: torch.Tensor | None, N: int, kernel: str) -> None:
    """A kernel's bias: none, or N contiguous float32s."""
    _check(
        bias is None or (bias.dtype == torch.float32 and bias.is_contiguous() and bias.numel() == N),
        kernel,
        f"the bias must be {N} contiguous float32s",
    )


def scale_back_(
    acc: torch.Tensor, col_scale: torch.Tensor, row_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """acc (M, N) contiguous int32 -> acc * col_scale (N,) * row_scale (M, 1) + bias (N,), float32, written
    over acc's own memory (returned as a float32 view of it). Only where scales_back()."""
    lib = _lib()
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
    lib = _lib()
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
    _check(
        y.dtype == row_scale.dtype == torch.float32 and y.is_contiguous() and row_scale.is_contiguous()
        and row_scale.numel() == M and all(t.device.type == "cpu" for t in (y, row_scale)),
        "rescale_log_softmax",
        "y (M, N) and row_scale (M, 1) contiguous float32 on CPU",
    )  # fmt: skip
    _check_bias(bias, N, "rescale_log_softmax")
    b = None if bias is None else bias.data_ptr()
    _lib().beamserve_rescale_log_softmax(y.data_ptr(), M, N, row_scale.data_ptr(), b)
    return y


MOST_HEAD_DIM = 256  # csrc/attention.c keeps a head's query and output in 16 vectors


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    length: int | torch.Tensor,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v for each row's one query over its own positions; only where built().

    q: (N, H, D) float32, contiguous. k, v: (R, H, T, D) float32 with equal strides and unit stride over D.
    length: positions every row attends over, or (N,) int64 per row. rows: where position t of row n
    lives, k[rows[n, t], :, t] ((N, T) int64, any strides; (N, 1) expanded over T for one row per query
    row, as a sentence's cross-attention keys); None: row n. Returns (N, H, D). IndexError, with nothing
    read, where a length or a cache row would lie outside k and v (the kernel checks each before it reads).
    """
    lib = _lib()
    N, H, D = q.shape
    _check(0 < D <= MOST_HEAD_DIM, "attend", f"heads of 1 to {MOST_HEAD_DIM} dimensions, not {D}")
    _check(q.dtype == k.dtype == v.dtype == torch.float32 and q.is_contiguous(), "attend", "float32, q contiguous")
    _check(k.dim() == 4 and k.shape == v.shape and k.shape[1] == H and k.shape[3] == D, "attend", "k, v (R, H, T, D)")
    _check(k.stride() == v.stride() and k.stride(3) == 1, "attend", "k and v with equal strides, unit over D")
    held = None if isinstance(length, int) else length if length.is_contiguous() else length.contiguous()
    _check(held is None or (held.dtype == torch.int64 and held.numel() >= N), "attend", f"{N} int64 lengths")
    lengths, each = (None, length) if held is None else (held.data_ptr(), 0)  # per row: the kernel finds the longest
    out = torch.empty(N, H, D)
    _check(rows is None or (rows.dtype == torch.int64 and rows.dim() == 2), "attend", "rows (N, T) int64")
    r, rs, ts, rN, rT = (
        (None, 0, 0, 0, 0) if rows is None else (rows.data_ptr(), rows.stride(0), rows.stride(1), *rows.shape)
    )
    R, T = k.shape[0], k.shape[2]
    failed = lib.beamserve_attend(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), N, H, D, k.stride(0), k.stride(1), k.stride(2), R, T,
        lengths, each, r, rs, ts, rN, rT, D**-0.5, out.data_ptr(),
    )  # fmt: skip
    if failed == -2:
        raise IndexError(
            f"attention: a head of {D}, a length or a cache row outside the cache's {R} rows of {T} positions"
        )
    if failed:
        raise MemoryError("no memory for the attention's scores")
    return out


def self_attend_step(
    qkv: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: int | torch.Tensor, lineage: torch.Tensor | None
) -> torch.Tensor:
    """A decoder step's self-attention on the KVCache (model/nn/kv_cache.py), in one call: row n's key and value
    from qkv (N, 3 * H * D) float32 (its query, key and value, unit stride within a row) written at its position
    of cache row n of k, v (R, H, T, D), then row n's query against its positions up to that one. pos: one position
    for every row, or (N,) int64 per row (rows at their own positions, no lineage). With a lineage (R', T') int64,
    lineage[n, pos] is set to n and row n reads position t from buffer row lineage[n, t]. Returns (N, H, D);
    IndexError, with nothing written, where a position or a lineage row would lie outside the cache. Only where
    built()."""
    lib = _lib()
    N, R, H, T, D = qkv.shape[0], k.shape[0], k.shape[1], k.shape[2], k.shape[3]
    if not (
        qkv.dtype == k.dtype == v.dtype == torch.float32 and qkv.dim() == 2 and qkv.shape[1] == 3 * H * D
        and qkv.stride(1) == 1 and k.dim() == 4 and k.shape == v.shape and k.stride() == v.stride()
        and k.stride(3) == 1 and 0 < D <= MOST_HEAD_DIM
    ):  # fmt: skip
        raise ValueError("self_attend_step: qkv (N, 3 H D), k and v (R, H, T, D) alike, float32")
    positions, at = None, 0
    if isinstance(pos, int):
        at = pos
    else:
        held = pos if pos.is_contiguous() else pos.contiguous()
        if held.dtype != torch.int64 or held.numel() != N:
            raise ValueError(f"self_attend_step: {N} int64 positions")
        positions = held.data_ptr()
    lin, lN, lT, rN, rT = None, 0, 0, 0, 0
    if lineage is not None:
        if lineage.dtype != torch.int64 or lineage.dim() != 2:
            raise ValueError("self_attend_step: the lineage must be (R', T') int64")
        lin, (lN, lT), (rN, rT) = lineage.data_ptr(), lineage.stride(), lineage.shape
    out = torch.empty(N, H, D)
    failed = lib.beamserve_self_attend_step(
        qkv.data_ptr(), qkv.stride(0), N, H, D, k.data_ptr(), v.data_ptr(), k.stride(0), k.stride(1), k.stride(2),
        R, T, positions, at, lin, lN, lT, rN, rT, D**-0.5, out.data_ptr(),
    )  # fmt: skip
    if failed == -2:
        raise IndexError(f"self-attention step: a position or a lineage row outside the cache's {R} rows of {T}")
    if failed:
        raise MemoryError("no memory for the attention's scores")
    return out


def follow(lineage: torch.Tensor, rows: torch.Tensor, t: int) -> None:
    """A lineage's reorder in one call (model/nn/kv_cache.py's KVCache.follow): lineage (R, T') int64 with unit
    column stride, row i < rows.numel() taking row rows[i]'s first t entries, rows (n,) int64 naming any rows."""
    _check(
        lineage.dtype == rows.dtype == torch.int64 and lineage.dim() == 2 and lineage.stride(1) == 1
        and rows.dim() == 1 and rows.is_contiguous() and lineage.is_cpu and rows.is_cpu,
        "follow", "lineage (R, T') int64 with unit column stride, rows (n,) int64 contiguous, on CPU",
    )  # fmt: skip
    R, T = lineage.shape
    failed = _lib().beamserve_follow(lineage.data_ptr(), R, T, lineage.stride(0), t, rows.data_ptr(), rows.numel())
    if failed == -2:
        raise IndexError(f"follow: a row outside the lineage's {R}, or {t} positions past its {T}")
    if failed:
        raise MemoryError("no memory for the lineage's reorder")


def copy_rows(k: torch.Tensor, v: torch.Tensor, dest: torch.Tensor, src: torch.Tensor, t: int) -> bool:
    """KVCache.copy in one call: k and v (L, R, H, T, D) float32 contiguous on CPU, row dest[i] of each taking
    positions [0, t) of row src[i] (dest, src (n,) int64 contiguous). False, having copied nothing, where a row is
    both written and read (the rows must be gathered first)."""
    _check(
        k.dtype == v.dtype == torch.float32 and k.dim() == 5 and k.shape == v.shape and k.is_contiguous()
        and v.is_contiguous() and k.is_cpu and v.is_cpu and dest.dtype == src.dtype == torch.int64
        and dest.dim() == 1 and dest.shape == src.shape and dest.is_contiguous() and src.is_contiguous(),
        "copy_rows", "k, v (L, R, H, T, D) float32 contiguous on CPU; dest, src (n,) int64 contiguous",
    )  # fmt: skip
    L, R, H, T, D = k.shape
    sL, sN, sH = k.stride()[:3]
    failed = _lib().beamserve_copy_rows(
        k.data_ptr(), v.data_ptr(), L, R, H, T, D, sL, sN, sH, t, dest.data_ptr(), src.data_ptr(), dest.numel()
    )
    if failed == -2:
        raise IndexError(f"copy_rows: a row outside the cache's {R}, or {t} positions past its {T}")
    if failed == -1:
        raise MemoryError("no memory for copy_rows' check")
    return failed == 0


def log_softmax_(x: torch.Tensor) -> torch.Tensor:
    """Each row of x (M, V) float32 on CPU, unit column stride, replaced by its log-softmax; returns x.
    Only where built()."""
    lib = _lib()
    _check(x.dtype == torch.float32 and x.device.type == "cpu", "log_softmax_", "x must be float32 on CPU")
    rows = x.view(-1, x.shape[-1]) if x.dim() != 2 else x  # a view: x's own memory, or a RuntimeError
    _check(rows.stride(-1) == 1, "log_softmax_", "x must have unit column stride")
    lib.beamserve_log_softmax(rows.data_ptr(), rows.shape[0], rows.shape[1], rows.stride(0))
    return x


MOST_CANDIDATES = 64


def top_candidates(
    log_probs: torch.Tensor, run_scores: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """search.top_candidates in one pass: log_probs (b, K, V) and run_scores (b, K) float32 on CPU, n at
    most MOST_CANDIDATES -> scores, beam, token, each (b, n). Only where built()."""
    lib = _lib()
    b, K, V = log_probs.shape
    _check(0 < n <= min(MOST_CANDIDATES, K * V), "top_candidates", f"1 to {MOST_CANDIDATES} candidates of K * V")
    _check(run_scores.shape == (b, K), "top_candidates", f"run_scores ({b}, {K})")
    _check(log_probs.dtype == run_scores.dtype == torch.float32, "top_candidates", "float32 scores")
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
    lib = _lib()
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
    failed = lib.beamserve_beam_step(
        log_probs.data_ptr(), b, K, V, run_scores.data_ptr(), run_tokens.data_ptr(), fin_scores.data_ptr(),
        fin_tokens.data_ptr(), fin_flags.data_ptr(), improvable.data_ptr(), T, pos.data_ptr(), max_lengths.data_ptr(),
        norm.data_ptr(), eos, int(early_stopping), src_beam.data_ptr(), token.data_ptr(), done.data_ptr(),
    )  # fmt: skip
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
        self.held = (*state, max_lengths)  # the tensors the pointers below are into
        self.args = (
            run_scores.data_ptr(), run_tokens.data_ptr(), fin_scores.data_ptr(), fin_tokens.data_ptr(),
            fin_flags.data_ptr(), improvable.data_ptr(), T,
        )  # fmt: skip
        self.limits = max_lengths.data_ptr()
        self.rules = (
            eos, int(early_stopping), self.suppressed.data_ptr(), len(suppressed), min_length,
            -1 if forced_bos is None else forced_bos, -1 if forced_eos is None else forced_eos,
        )  # fmt: skip
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
        src_beam, token, done, rows = self.answer()
        ended = _lib().beamserve_beam_advance(
            log_probs.data_ptr(), b, K, V, *self.args, positions, at, self.limits, norms, one, *self.rules,
            src_beam.data_ptr(), token.data_ptr(), done.data_ptr(), rows.data_ptr(),
        )  # fmt: skip
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


BeamStep = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]  # what BeamAdvance returns


def beam_steps(
    chain: tuple[ctypes.Array[ctypes.c_void_p], ctypes.Array[ctypes.c_void_p], ctypes.Array[ctypes.c_void_p]],
    source: tuple[int, ...],
    embed: torch.Tensor,
    scale: float,
    at: torch.Tensor,
    output: LinearC,
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
    _check(
        tokens.dtype == torch.int64 and tokens.shape == (N,) and embed.dtype == at.dtype == norms.dtype == torch.float32
        and at.shape[1] == C and norms.shape == (steps,) and pos >= 1
        and all(t.is_contiguous() and t.is_cpu for t in (tokens, embed, at, norms)),
        "beam_steps", f"tokens ({N},) int64, embed (V, C), at (steps, C) and norms (steps,) float32, pos >= 1",
    )  # fmt: skip
    advance.check_vocabulary(output.N)
    x, logp, ran = torch.empty(N, C), torch.empty(N, output.N), (ctypes.c_int64 * 2)()
    src_beam, token, done, rows = advance.answer()
    failed = _lib().beamserve_beam_steps(
        *chain, len(chain[0]), *source, C, embed.data_ptr(), V, scale, at.data_ptr(), ctypes.byref(output), b, K,
        *advance.args, advance.limits, norms.data_ptr(), *advance.rules, tokens.data_ptr(), pos, steps,
        x.data_ptr(), logp.data_ptr(), src_beam.data_ptr(), token.data_ptr(), done.data_ptr(), rows.data_ptr(), ran,
    )  # fmt: skip
    if failed == -3:
        raise IndexError(f"beam_steps: a token id outside the embedding's {V} rows")
    if failed == -4:  # the beam step's -2
        advance.check_answer(-2, output.N)
    _raise_sublayer(failed, "beam_steps")
    return ran[0], (src_beam, token, done, rows, ran[1]), logp


def _each(values: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    """values as n contiguous CPU values of dtype, or ValueError."""
    if not (values.dtype == dtype and values.numel() == n and values.is_contiguous() and values.device.type == "cpu"):
        raise ValueError(f"BeamAdvance: {n} contiguous {dtype} per sentence")
    return values


class LinearC(ctypes.Structure):
    """csrc/sublayers.c's beamserve_linear_c: a linear layer packed for one of the library's GEMMs (kind 0: int8
    with VNNI; 1: float32), its bias."""

    _fields_ = [
        ("packed", ctypes.c_void_p),
        ("comp", ctypes.c_void_p),
        ("scale", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("N", ctypes.c_int64),
        ("K", ctypes.c_int64),
        ("kind", ctypes.c_int64),
    ]


def c_linear(w: VnniWeight | F32Weight, bias: torch.Tensor | None) -> tuple[LinearC, tuple[torch.Tensor, ...]]:
    """The struct a sublayer call reads for weight w and its bias, and the tensors it points into (to be held
    as long as the struct is)."""
    if bias is not None and (bias.dtype != torch.float32 or bias.numel() != w.N or not bias.is_contiguous()):
        raise ValueError(f"c_linear: the bias must be {w.N} contiguous float32s")
    b = None if bias is None else bias.data_ptr()
    held = () if bias is None else (bias,)
    if isinstance(w, F32Weight):
        return LinearC(w.packed.data_ptr(), None, None, b, w.N, w.K, 1), (w.packed, *held)
    struct = LinearC(w.packed.data_ptr(), w.comp.data_ptr(), w.scale.data_ptr(), b, w.N, w.K, 0)
    return struct, (w.packed, w.comp, w.scale, *held)


class KV(ctypes.Structure):
    """csrc/sublayers.c's beamserve_kv: one layer's keys and values, and the lineage of the rows reading them."""

    _fields_ = [
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        *((name, ctypes.c_int64) for name in ("H", "D", "sN", "sH", "sT", "R", "T")),
        ("lineage", ctypes.c_void_p),
        *((name, ctypes.c_int64) for name in ("lN", "lT", "rN", "rT")),
        ("scale", ctypes.c_float),
    ]


class LayerC(ctypes.Structure):
    """csrc/sublayers.c's beamserve_layer_c: one decoder layer's structs for decoder_segment (fc1's packed pointer
    None: fc1 runs outside, float32), its three LayerNorms' weights, biases and eps, and whether they come first."""

    _fields_ = [
        *((name, LinearC) for name in ("self_in", "self_out", "cross_in", "cross_out", "fc1", "fc2")),
        ("norm_weight", ctypes.c_void_p * 3),
        ("norm_bias", ctypes.c_void_p * 3),
        ("eps", ctypes.c_float * 3),
        ("pre", ctypes.c_int64),
    ]


def layer_c(
    linears: tuple[LinearC, LinearC, LinearC, LinearC, LinearC | None, LinearC],
    norms: tuple[tuple[torch.Tensor, torch.Tensor, float], ...],
    pre: bool,
) -> LayerC:
    """The struct for one layer: its six linears' structs (fc1 None: float32, outside), its three norms (weight and
    bias of C contiguous float32s, eps), post- or pre-norm. The caller holds what the structs point into."""
    C = linears[0].K
    if len(norms) != 3 or not all(
        w.dtype == b.dtype == torch.float32 and w.shape == b.shape == (C,) and w.is_contiguous() and b.is_contiguous()
        for w, b, _ in norms
    ):
        raise ValueError(f"layer_c: three norms of {C} contiguous float32 weights and biases")
    fc1 = linears[4] if linears[4] is not None else LinearC(None, None, None, None, 0, 0, 0)
    return LayerC(
        *linears[:4], fc1, linears[5],
        (ctypes.c_void_p * 3)(*(w.data_ptr() for w, _, _ in norms)),
        (ctypes.c_void_p * 3)(*(b.data_ptr() for _, b, _ in norms)),
        (ctypes.c_float * 3)(*(eps for _, _, eps in norms)),
        int(pre),
    )  # fmt: skip


def layer_norms_exactly() -> bool:
    """Whether csrc/layer_norm.c gives torch.native_layer_norm's bits here: PyTorch picks its kernel's vector width
    by this CPU (and ATEN_CPU_CAPABILITY), and the C one reproduces the 8-lane kernel of its AVX2 and AVX-512
    builds. Compared once, on rows of several widths and scales."""
    global _EXACT_NORMS
    if _LIB is None:  # not built, or turned off since
        return False
    if _EXACT_NORMS is None:
        _EXACT_NORMS = _norms_agree()
    return _EXACT_NORMS


_EXACT_NORMS: bool | None = None


def _norms_agree() -> bool:
    g = torch.Generator().manual_seed(0)
    for width in (7, 256, 333, 1024, 4100):
        x = torch.randn(16, width, generator=g) * torch.rand(16, 1, generator=g) * 20 + torch.randn(16, 1, generator=g)
        x[:4] = torch.randn(4, width, generator=g).exp()  # skewed rows
        weight, bias = torch.randn(width, generator=g), torch.randn(width, generator=g)
        with torch.inference_mode():
            expected = torch.native_layer_norm(x, (width,), weight, bias, 1e-5)[0]
        if not torch.equal(layer_norm(x, weight, bias, 1e-5), expected):
            return False
    return True


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm over x's rows (M, C) float32 contiguous, by csrc/layer_norm.c: torch.native_layer_norm's bits where
    layer_norms_exactly()."""
    M, C = x.shape
    if not (
        x.dtype == weight.dtype == bias.dtype == torch.float32 and weight.shape == bias.shape == (C,)
        and all(t.is_contiguous() for t in (x, weight, bias))
    ):  # fmt: skip
        raise ValueError(f"layer_norm: x (M, {C}), its weight and bias ({C},), float32 and contiguous")
    y = torch.empty_like(x)
    _lib().beamserve_layer_norm(x.data_ptr(), M, C, weight.data_ptr(), bias.data_ptr(), eps, y.data_ptr())
    return y


def decoder_segment(
    ending: LayerC | None,
    h: torch.Tensor | None,
    layer: LayerC | None,
    own: KV | None,
    source_kv: KV | None,
    positions: tuple[int | None, int],
    source: tuple[int, ...],
    x: torch.Tensor,
    u: torch.Tensor,
    f: torch.Tensor | None,
) -> None:
    """csrc/sublayers.c's beamserve_decoder_segment, its inputs checked by the caller (model/nn/c_step.py: x and u
    (N, C), h (N, ending's fc2.K) and f (N, layer's fc1.N) float32 contiguous, the KV structs of C = H x D, the
    positions and source of positions_of and source_of): layer `ending`'s feed-forward closed over h, then
    `layer`'s attention sublayers, x updated in place, u its feed-forward's input, f = fc1(u) where fc1 is in C."""
    failed = _lib().beamserve_decoder_segment(
        None if ending is None else ctypes.byref(ending), None if h is None else h.data_ptr(),
        None if layer is None else ctypes.byref(layer), None if own is None else ctypes.byref(own),
        None if source_kv is None else ctypes.byref(source_kv), *positions, *source, x.shape[0], x.shape[1],
        x.data_ptr(), u.data_ptr(), None if f is None else f.data_ptr(),
    )  # fmt: skip
    _raise_sublayer(failed, "decoder_segment")


def decoder_layers(
    layers: ctypes.Array[ctypes.c_void_p],
    own: ctypes.Array[ctypes.c_void_p],
    source_kv: ctypes.Array[ctypes.c_void_p],
    positions: tuple[int | None, int],
    source: tuple[int, ...],
    x: torch.Tensor,
    output: LinearC | None = None,
) -> torch.Tensor | None:
    """csrc/sublayers.c's beamserve_decoder_layers, its inputs checked by the caller (model/nn/c_step.py): every
    decoder layer of a step in one call, x (N, C) float32 contiguous updated in place; layers, own and source_kv
    the addresses of each layer's LayerC (fc1 in C) and KV structs; each feed-forward activated by silu_ (where
    silu_exactly()). With `output` (a struct of c_linear), then x's output projection and each row's
    log-softmax -> (N, output.N); else None."""
    N, C = x.shape
    logp = None if output is None else torch.empty(N, output.N)
    failed = _lib().beamserve_decoder_layers(
        layers, own, source_kv, len(layers), *positions, *source, N, C, x.data_ptr(),
        None if output is None else ctypes.byref(output), None if logp is None else logp.data_ptr(),
    )  # fmt: skip
    _raise_sublayer(failed, "decoder_layers")
    return logp


def silu_(x: torch.Tensor) -> torch.Tensor:
    """x float32 contiguous on CPU replaced by its SiLU in one call (csrc/silu.c), torch.nn.functional.silu's bits
    where silu_exactly(); returns x."""
    _check(x.dtype == torch.float32 and x.is_contiguous() and x.is_cpu, "silu_", "x float32 contiguous on CPU")
    _lib().beamserve_silu(x.data_ptr(), x.numel())
    return x


SILU_RANGE = 32768  # ATen's grain: a tensor below it is one range whatever the intra-op thread count
SILU_PAIR = 32  # lanes of a pair of AVX-512 vectors: a range of a multiple of it has no lanes past its last pair at
# either width, so the vector arithmetic alone computes it, which silu_exactly compares whatever ATen's width


def silu_exactly() -> bool:
    """Whether csrc/silu.c gives torch's silu bits here on a tensor of fewer than SILU_RANGE elements (ATen takes
    such a tensor as one range, whose lanes past its last pair of vectors it computes one by one): PyTorch picks
    its vector width by this CPU (and ATEN_CPU_CAPABILITY), the library by its level, so where they differ only
    the lanes past the last pair of the wider can differ (none in a multiple of SILU_PAIR). Compared once, on every
    binade's values, both signs, zeros, infinities and NaN, over whole pairs and a tail."""
    return _LIB is not None and _silu_agrees()


@functools.cache
def _silu_agrees() -> bool:
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-(2**31), 2**31, (16384,), generator=g, dtype=torch.int64).to(torch.int32)
    ramp = torch.linspace(-120.0, 120.0, 8191)
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), -104.0, 100.0, 88.7, -88.7])
    x = torch.cat([bits.view(torch.float32), ramp, special])  # 24,584 values: 768 pairs of 32 lanes, and 8
    with torch.inference_mode():
        expected = torch.nn.functional.silu(x)
    got = silu_(x.clone())
    same = (got.view(torch.int32) == expected.view(torch.int32)) | (got.isnan() & expected.isnan())
    return bool(same.all())


def encoder_segment(
    ending: LayerC | None,
    h: torch.Tensor | None,
    layer: LayerC | None,
    heads: int,
    sentences: tuple[int, int],
    source: tuple[int, ...],
    x: torch.Tensor,
    u: torch.Tensor,
    f: torch.Tensor | None,
) -> None:
    """csrc/sublayers.c's beamserve_encoder_segment, its inputs checked by the caller (model/nn/c_encode.py: x and u
    (B S, C), h (B S, ending's fc2.K) and f (B S, layer's fc1.N) float32 contiguous; sentences (B, S); source as
    source_of gives it, each row's length and sentence): layer `ending`'s feed-forward closed over h, then `layer`'s
    self-attention sublayer, x updated in place, u its feed-forward's input, f = fc1(u) where fc1 is in C."""
    C = x.shape[1]
    failed = _lib().beamserve_encoder_segment(
        None if ending is None else ctypes.byref(ending), None if h is None else h.data_ptr(),
        None if layer is None else ctypes.byref(layer), *sentences, heads, *source, (C // heads) ** -0.5,
        x.shape[0], C, x.data_ptr(), u.data_ptr(), None if f is None else f.data_ptr(),
    )  # fmt: skip
    _raise_sublayer(failed, "encoder_segment")


def encoder_layers(
    layers: ctypes.Array[ctypes.c_void_p],
    heads: int,
    sentences: tuple[int, int],
    source: tuple[int, ...],
    x: torch.Tensor,
) -> None:
    """csrc/sublayers.c's beamserve_encoder_layers, its inputs checked by the caller (model/nn/c_encode.py): every
    encoder layer in one call, x (B S, C) float32 contiguous updated in place, layers the addresses of each
    layer's LayerC (fc1 in C, `heads` heads), each feed-forward activated as decoder_layers does it."""
    C = x.shape[1]
    failed = _lib().beamserve_encoder_layers(
        layers, len(layers), heads, *sentences, *source, (C // heads) ** -0.5, x.shape[0], C, x.data_ptr()
    )
    _raise_sublayer(failed, "encoder_layers")


def embed(tokens: torch.Tensor, weight: torch.Tensor, scale: float, at: torch.Tensor) -> torch.Tensor:
    """A decode step's input rows in one call: weight[tokens] * scale + at, tokens (N,) int64, weight (V, C) and at
    ((1 or N), C) float32 contiguous; the bits of F.embedding(tokens, weight) * scale + at. IndexError where a
    token is not below V, as F.embedding raises."""
    N, (V, C) = tokens.numel(), weight.shape
    if not (
        tokens.dtype == torch.int64 and tokens.dim() == 1 and weight.dtype == at.dtype == torch.float32
        and at.dim() == 2 and at.shape[1] == C and at.shape[0] in (1, N)
        and all(t.is_contiguous() for t in (tokens, weight, at))
    ):  # fmt: skip
        raise ValueError(f"embed: tokens (N,) int64, weight (V, {C}) and at (1 or N, {C}) float32, contiguous")
    x = torch.empty(N, C)
    stride = C if at.shape[0] == N and N > 1 else 0
    failed = _lib().beamserve_embed(
        tokens.data_ptr(), N, weight.data_ptr(), V, C, scale, at.data_ptr(), stride, x.data_ptr()
    )
    if failed:
        raise IndexError(f"embed: a token id outside the vocabulary of {V}")
    return x


def kv_view(k: torch.Tensor, v: torch.Tensor, lineage: torch.Tensor | None) -> KV:
    """The struct for k, v (R, H, T, D) float32 alike with unit stride over D, and a lineage (R', T') int64 or None.
    The caller holds the tensors as long as the struct."""
    if not (
        k.dtype == v.dtype == torch.float32 and k.dim() == 4 and k.shape == v.shape and k.stride() == v.stride()
        and k.stride(3) == 1 and 0 < k.shape[3] <= MOST_HEAD_DIM
    ):  # fmt: skip
        raise ValueError("kv_view: k and v (R, H, T, D) float32 alike, unit stride over D")
    R, H, T, D = k.shape
    lin, lN, lT, rN, rT = None, 0, 0, 0, 0
    if lineage is not None:
        if lineage.dtype != torch.int64 or lineage.dim() != 2:
            raise ValueError("kv_view: the lineage must be (R', T') int64")
        lin, (lN, lT), (rN, rT) = lineage.data_ptr(), lineage.stride(), lineage.shape
    sN, sH, sT, _ = k.stride()
    return KV(k.data_ptr(), v.data_ptr(), H, D, sN, sH, sT, R, T, lin, lN, lT, rN, rT, D**-0.5)


def _rows_in(name: str, x: torch.Tensor, residual: torch.Tensor, C: int) -> None:
    if not (
        x.dtype == residual.dtype == torch.float32 and x.dim() == 2 and x.shape[1] == C and x.is_contiguous()
        and residual.shape == x.shape and residual.is_contiguous()
    ):  # fmt: skip
        raise ValueError(f"{name}: x and the residual (N, {C}) float32, contiguous")


def _raise_sublayer(failed: int, name: str) -> None:
    if failed == -2:
        raise IndexError(f"{name}: the weights' shapes disagree, or a position or a row lies outside the cache")
    if failed:
        raise RuntimeError(f"{name}: no memory for the sublayer's rows, or no kernel for its weights in this build")


def self_sublayer(
    x: torch.Tensor, residual: torch.Tensor, qkv: LinearC, out: LinearC, kv: KV, pos: int | torch.Tensor
) -> torch.Tensor:
    """residual + out(self-attention(qkv(x))) for a step's rows x (N, C), each row's key and value written at its
    position first (pos: one for every row, or (N,) int64), in one call: the bits of project_qkv, self_attend_step
    and out_proj with the residual in turn. Only where the structs' kernels run."""
    _rows_in("self_sublayer", x, residual, kv.H * kv.D)
    positions = positions_of(pos, x.shape[0])
    if positions is None:
        raise ValueError(f"self_sublayer: {x.shape[0]} contiguous int64 positions")
    return self_sublayer_checked(x, residual, qkv, out, kv, positions)


def cross_sublayer(
    x: torch.Tensor,
    residual: torch.Tensor,
    q: LinearC,
    out: LinearC,
    kv: KV,
    row_map: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """residual + out(cross-attention(q(x))) for a step's rows x (N, C) in one call, each row over its sentence's
    source as CrossCache.row_map gives it: the bits of q_proj, attend and out_proj with the residual. Only where
    the structs' kernels run."""
    _rows_in("cross_sublayer", x, residual, kv.H * kv.D)
    source = source_of(row_map, x.shape[0])
    if source is None:
        raise ValueError(f"cross_sublayer: {x.shape[0]} contiguous int64 lengths and (N, S) int64 rows")
    return cross_sublayer_checked(x, residual, q, out, kv, source)


def linear_forward(w: LinearC, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """x (M, K) float32 contiguous @ w^T + its bias, plus residual (M, N) where given, by the struct of c_linear:
    the bits of vnni_linear or f32_linear with one call's checks. Only where the struct's kernel runs."""
    if not (x.dtype == torch.float32 and x.dim() == 2 and x.shape[1] == w.K and x.is_contiguous()):
        raise ValueError(f"linear_forward: x (M, {w.K}) float32, contiguous")
    M = x.shape[0]
    if residual is not None and not (
        residual.dtype == torch.float32 and residual.shape == (M, w.N) and residual.is_contiguous()
    ):
        raise ValueError(f"linear_forward: the residual ({M}, {w.N}) float32, contiguous")
    return linear_forward_checked(w, x, residual)


# The calls themselves, for the wrappers above and for a caller that checks what it hands them once for many
# calls (model/nn/c_step.py: a step's decoder layers); x and the residual are (N, C) float32, contiguous.


def positions_of(pos: int | torch.Tensor, rows: int) -> tuple[int | None, int] | None:
    """pos as self_sublayer_checked takes it: (a pointer to `rows` int64 positions or None, the one position of
    every row); None where pos is neither an int nor `rows` contiguous int64."""
    if isinstance(pos, int):
        return None, pos
    if pos.dtype == torch.int64 and pos.numel() == rows and pos.is_contiguous():
        return pos.data_ptr(), 0
    return None


def source_of(row_map: tuple[torch.Tensor, torch.Tensor], rows: int) -> tuple[int, ...] | None:
    """CrossCache.row_map as cross_sublayer_checked takes it (its lengths, and its rows with their strides and
    shape); None where it is not `rows` contiguous int64 lengths and (rows, S) int64 rows."""
    lengths, sentence_rows = row_map
    if not (
        lengths.dtype == sentence_rows.dtype == torch.int64 and lengths.numel() >= rows and lengths.is_contiguous()
        and sentence_rows.dim() == 2
    ):  # fmt: skip
        return None
    return (lengths.data_ptr(), sentence_rows.data_ptr(), *sentence_rows.stride(), *sentence_rows.shape)


def self_sublayer_checked(
    x: torch.Tensor, residual: torch.Tensor, qkv: LinearC, out: LinearC, kv: KV, positions: tuple[int | None, int]
) -> torch.Tensor:
    """self_sublayer once x, the residual (against kv's H x D) and positions_of(pos) have been checked."""
    y = torch.empty_like(x)
    failed = _lib().beamserve_self_sublayer(
        x.data_ptr(), residual.data_ptr(), x.shape[0], ctypes.byref(qkv), ctypes.byref(out), ctypes.byref(kv),
        *positions, y.data_ptr(),
    )  # fmt: skip
    _raise_sublayer(failed, "self_sublayer")
    return y


def cross_sublayer_checked(
    x: torch.Tensor, residual: torch.Tensor, q: LinearC, out: LinearC, kv: KV, source: tuple[int, ...]
) -> torch.Tensor:
    """cross_sublayer once x, the residual (against kv's H x D) and source_of(row_map) have been checked."""
    y = torch.empty_like(x)
    failed = _lib().beamserve_cross_sublayer(
        x.data_ptr(), residual.data_ptr(), x.shape[0], ctypes.byref(q), ctypes.byref(out), ctypes.byref(kv),
        *source, y.data_ptr(),
    )  # fmt: skip
    _raise_sublayer(failed, "cross_sublayer")
    return y


def linear_forward_checked(w: LinearC, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    """linear_forward once x (M, w.K) and the residual (M, w.N) have been checked."""
    y = torch.empty(x.shape[0], w.N)
    r = None if residual is None else residual.data_ptr()
    failed = _lib().beamserve_linear_forward(ctypes.byref(w), x.data_ptr(), x.shape[0], r, y.data_ptr())
    _raise_for(failed, "linear_forward")
    return y
