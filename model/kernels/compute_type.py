"""Compute types as CTranslate2 names them: the float type a model computes in, and whether its GEMMs
run in int8 (model/kernels/quant.py).

    float32, float16 (CUDA), bfloat16      every weight and activation in that type
    int8, int8_float32                     int8 GEMMs (every linear layer and the output projection),
                                           float32 elsewhere (embeddings, attention, norms, softmax)
    int8_bfloat16                          int8 GEMMs, bfloat16 elsewhere (CPUs with bfloat16 support)
    default                                float16 on CUDA, float32 on CPU
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from model.kernels.gemm import Linear
from model.kernels.quant import INT8_SLOT, OUTPUT_INT8_SLOT, Int8Weight, int8_of, use_int8
from model.options import COMPUTE_TYPES

FLOATS = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
INT8 = {"int8": "float32", "int8_float32": "float32", "int8_bfloat16": "bfloat16"}  # -> the float type elsewhere
assert set(COMPUTE_TYPES) == {"default", *FLOATS, *INT8}


@dataclass(frozen=True)
class ComputeType:
    name: str  # as resolved: never "default"
    dtype: torch.dtype  # of everything that is not an int8 GEMM
    int8: bool


def named(dtype: torch.dtype) -> str:
    """The compute type of a model whose every weight is `dtype` ("float32", ...); else the dtype's name."""
    return next((name for name, d in FLOATS.items() if d == dtype), str(dtype))


def cpu_bfloat16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX), as oneDNN reports it."""
    try:
        onednn = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
        return bool(onednn and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def supported(device: torch.device) -> list[str]:
    """The compute types this device (and, on CPU, this processor) runs."""
    if device.type == "cuda":
        return ["default", "float32", "float16", "bfloat16"]
    bf16 = cpu_bfloat16()
    return ["default", "float32", "int8", "int8_float32", *(["bfloat16", "int8_bfloat16"] if bf16 else [])]


def resolve(name: str, device: torch.device) -> ComputeType:
    """The compute type `name` on `device`; ValueError naming the supported ones otherwise."""
    if name not in COMPUTE_TYPES:
        raise ValueError(f"compute_type must be one of {', '.join(COMPUTE_TYPES)}, got {name!r}")
    ok = supported(device)
    if name not in ok:
        where = "this CPU (no bfloat16 support)" if device.type == "cpu" else device.type
        raise ValueError(f"compute_type {name!r} is not supported on {where}; supported: {', '.join(ok)}")
    if name == "default":
        name = "float16" if device.type == "cuda" else "float32"
    if name in INT8:
        return ComputeType(name, FLOATS[INT8[name]], True)
    return ComputeType(name, FLOATS[name], False)


@dataclass(frozen=True)
class Int8Site:
    """Where a weight that computes in int8 has its int8 form: the module it is registered on, under `slot`."""

    owner: nn.Module
    slot: str
    weight: torch.Tensor

    @property
    def form(self) -> Int8Weight | None:
        return int8_of(self.owner, self.slot)


def int8_sites(model: nn.Module, output_weight: torch.Tensor) -> dict[str, Int8Site]:
    """The weights that compute in int8, by name: every linear layer's (its form on the layer), and the output
    projection (OUTPUT_PROJECTION: with tied embeddings it is the embedding table, which lookups read in float;
    its form on the model, as OUTPUT_INT8_SLOT)."""
    sites = {
        f"{name}.weight": Int8Site(m, INT8_SLOT, m.weight) for name, m in model.named_modules() if isinstance(m, Linear)
    }
    if not any(site.weight is output_weight for site in sites.values()):  # an own lm_head is a Linear already
        sites[OUTPUT_PROJECTION] = Int8Site(model, OUTPUT_INT8_SLOT, output_weight)
    return sites


OUTPUT_PROJECTION = "output_projection"


def quantize_int8(model: nn.Module, output_weight: torch.Tensor, saved: dict[str, Int8Weight] | None = None) -> None:
    """Route every linear layer's GEMM and the output projection through int8: the weights `saved` in an
    int8 checkpoint (model/io/checkpoint.py), or else quantised per row now, once. Embedding lookups keep
    the float table."""
    for name, site in int8_sites(model, output_weight).items():
        use_int8(site.owner, site.weight, saved.get(name) if saved is not None else None, site.slot)


def release_float_weights(model: nn.Module, output_weight: torch.Tensor) -> None:
    """Free the float form of every weight that now computes only in int8 (each linear layer's; not a tied
    output projection, whose embedding table lookups read in float): a served int8 model multiplies by
    the int8 forms alone, so the float ones would only take memory (a quarter of it each again). Each
    weight keeps its rows and its int8 form, with no columns: a float GEMM over it (autograd, another
    device) fails on the shapes instead of computing with stale numbers."""
    for name, site in int8_sites(model, output_weight).items():
        if name != OUTPUT_PROJECTION and site.form is not None:
            site.weight.data = site.weight.data.new_empty((site.weight.shape[0], 0))
