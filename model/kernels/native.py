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
bound from csrc/beamserve.h (model/kernels/bindings.py).

This module holds what the rest share: the bound kernels (`kernels()`), which of them run on this CPU, the
argument checks, and the row passes with ATen's bits (LayerNorm, SiLU, log-softmax). The calls by role:
model/kernels/c_gemm.py (the GEMMs and their row passes), c_attention.py, c_search.py, c_layers.py.

BEAMSERVE_NATIVE_KERNELS=0 turns it off; =x86-64-v3 (or another level) binds the level a
CPU of that level would, to measure it. The kernels run on the calling thread: a one-thread pass
still beats PyTorch's passes spread over threads (docs/benchmarks.md, "Compute types on CPU").
"""

from __future__ import annotations

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


def kernels() -> Kernels:
    if _LIB is None:
        raise RuntimeError("the C kernels are not loaded")
    return _LIB


def check(holds: bool, kernel: str, what: str) -> None:
    """What a kernel will read or write is what the call hands it: checked here, not by `assert` (which
    `python -O` strips), as a wrong size would touch another tensor's memory."""
    if not holds:
        raise ValueError(f"{kernel}: {what}")


def int8_gemm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (M, K) int8 with unit column stride, w (N, K) int8 contiguous -> x @ w^T, (M, N) int32, exact (as
    torch._int_mm). Only where multiplies_int8(x)."""
    lib = kernels()
    check(x.dtype == w.dtype == torch.int8 and x.dim() == w.dim() == 2, "int8_gemm", "two 2-d int8 tensors")
    (M, K), N = x.shape, w.shape[0]
    check(
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
    return vnni() and bool(kernels().beamserve_vnni_amx())


def f32() -> bool:
    """Whether the float32 GEMM (csrc/f32_gemm.c) runs here: the build has it (AVX-512, or AVX2 with FMA)."""
    return _LIB is not None and _F32


def raise_for(failed: int, kernel: str) -> None:
    if failed == -1:
        raise RuntimeError(
            f"{kernel}: this build or CPU has no such kernel (AVX-512 VNNI for int8, AVX-512 for float32)"
        )
    if failed:
        raise MemoryError(f"{kernel}: no memory for the quantised rows")


def log_softmax_(x: torch.Tensor) -> torch.Tensor:
    """Each row of x (M, V) float32 on CPU, unit column stride, replaced by its log-softmax; returns x.
    Only where built()."""
    lib = kernels()
    check(x.dtype == torch.float32 and x.device.type == "cpu", "log_softmax_", "x must be float32 on CPU")
    rows = x.view(-1, x.shape[-1]) if x.dim() != 2 else x  # a view: x's own memory, or a RuntimeError
    check(rows.stride(-1) == 1, "log_softmax_", "x must have unit column stride")
    lib.beamserve_log_softmax(rows.data_ptr(), rows.shape[0], rows.shape[1], rows.stride(0))
    return x


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
    kernels().beamserve_layer_norm(x.data_ptr(), M, C, weight.data_ptr(), bias.data_ptr(), eps, y.data_ptr())
    return y


def silu_(x: torch.Tensor) -> torch.Tensor:
    """x float32 contiguous on CPU replaced by its SiLU in one call (csrc/silu.c), torch.nn.functional.silu's bits
    where silu_exactly(); returns x."""
    check(x.dtype == torch.float32 and x.is_contiguous() and x.is_cpu, "silu_", "x float32 contiguous on CPU")
    kernels().beamserve_silu(x.data_ptr(), x.numel())
    return x


SILU_RANGE = 32768  # ATen's grain: a tensor below it is one range whatever the intra-op thread count


SILU_PAIR = 32  # lanes of a pair of AVX-512 vectors: a range of a multiple of it has no lanes past its last pair at


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
