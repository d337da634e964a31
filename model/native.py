"""The int8 row kernels of model/csrc/int8_rows.c, where the package was built with them.

An int8 GEMM (model/quant.py) is wrapped in per-row passes: quantising the activation rows, and scaling
the int32 product back per row and per column with the bias. In PyTorch's ops they are eight and three
passes over memory, each a call of its own; on the decoder's shapes they took as long as the GEMM.
The C kernels do each in one pass and give the same bits (tests/test_native.py), so a translation does
not depend on whether they are built. `pip install` compiles them (setup.py; optional: without a C
compiler the install goes on without them); BEAMSERVE_NATIVE_KERNELS=0 turns them off.

They run on the calling thread: a one-thread pass still beats PyTorch's passes spread over threads, as
int8 decoding on two threads gains as much from them as on one (docs/benchmarks.md, "Compute types on
CPU": `beamserve-int8` against `beamserve-int8-pytorch`).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os

import torch

ENV = "BEAMSERVE_NATIVE_KERNELS"


def _load() -> ctypes.CDLL | None:
    if os.environ.get(ENV, "1") == "0":
        return None
    try:
        spec = importlib.util.find_spec("model._int8_rows")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:  # built without them (no C compiler)
        return None
    try:
        lib = ctypes.CDLL(spec.origin)
    except OSError:
        return None
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.beamserve_quantize_rows.argtypes = [p, i64, i64, i64, p, p]
    lib.beamserve_quantize_rows.restype = None
    lib.beamserve_scale_back.argtypes = [p, i64, i64, p, p, p, p]
    lib.beamserve_scale_back.restype = None
    lib.beamserve_vectorised.argtypes, lib.beamserve_vectorised.restype = [], ctypes.c_int
    return lib


_LIB = _load()
# Which kernels beat PyTorch's vectorised operators on this CPU: a kernel the compiler leaves scalar here
# (the quantisation without AVX-512, the scale-back without a vector fused multiply-add) would be slower.
_VECTORISED = _LIB.beamserve_vectorised() if _LIB is not None else 0


def turn_off() -> None:
    """From now on model/quant.py computes with PyTorch's ops (side-by-side measurements, tests)."""
    global _LIB
    _LIB = None


def built() -> bool:
    """Whether the library is built and loaded (and not turned off), whatever this CPU runs of it."""
    return _LIB is not None


def available() -> bool:
    """Whether any C kernel runs here (built, loadable, not turned off, vectorised on this CPU)."""
    return quantizes() or scales_back()


def quantizes() -> bool:
    """Whether quantize_rows runs here."""
    return _LIB is not None and bool(_VECTORISED & 1)


def scales_back() -> bool:
    """Whether scale_back_ runs here."""
    return _LIB is not None and bool(_VECTORISED & 2)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) float32 on CPU, unit column stride -> (M, K) int8 and (M, 1) float32 scales, as
    model.quant.quantize_rows computes them. Only where quantizes()."""
    assert _LIB is not None
    M, K = x.shape
    q = torch.empty(M, K, dtype=torch.int8)
    scale = torch.empty(M, 1)
    _LIB.beamserve_quantize_rows(x.data_ptr(), M, K, x.stride(0), q.data_ptr(), scale.data_ptr())
    return q, scale


def scale_back_(
    acc: torch.Tensor, col_scale: torch.Tensor, row_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """acc (M, N) contiguous int32 -> acc * col_scale (N,) * row_scale (M, 1) + bias (N,), float32, written
    over acc's own memory (returned as a float32 view of it). Only where scales_back()."""
    assert _LIB is not None
    M, N = acc.shape
    y = acc.view(torch.float32)
    b = None if bias is None else bias.data_ptr()
    _LIB.beamserve_scale_back(acc.data_ptr(), M, N, col_scale.data_ptr(), row_scale.data_ptr(), b, y.data_ptr())
    return y
