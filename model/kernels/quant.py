"""int8 GEMMs for CPU inference, as CTranslate2's int8 compute type does them.

Each weight row has its own scale (quantised once, at load); each activation row gets its own scale,
computed on the fly from that row alone. The product of the two int8 matrices is exact in int32, and
each output element is then scaled by its row's and its column's scale, so a sentence's result never
depends on what it is batched with (a per-tensor activation scale, as PyTorch's dynamic quantisation
uses, would make it depend on the batch's largest value).

The product is exact whichever kernel computes it, so every kernel gives the same bits; which one runs
(model/kernels/int8_kernels.py: C with AVX-512 VNNI, oneDNN's int8 matmul, torch._int_mm, C with 16-bit
products) is measured per weight shape and row count at load (model/kernels/int8_choice.py).
"""

from __future__ import annotations

import torch
from torch import nn

from model.kernels import int8_choice, native
from model.kernels.int8_kernels import Int8Weight, multiply, quantize_rows, with_forms
from model.kernels.log_softmax import log_softmax_

__all__ = [
    "INT8_SLOT",
    "OUTPUT_INT8_SLOT",
    "Int8Weight",
    "int8_of",
    "int8_weight",
    "linear_int8",
    "quantize_weight",
    "use_int8",
]


def quantize_weight(weight: torch.Tensor) -> Int8Weight:
    q, scale = quantize_rows(weight.detach())
    return int8_weight(q.contiguous(), scale.squeeze(1).contiguous())


def int8_weight(qweight: torch.Tensor, scale: torch.Tensor, plan: tuple[str, ...] | None = None) -> Int8Weight:
    """An int8 (N, K) weight and its (N,) row scales, with the kernels `plan` names for each row bucket (by
    default those int8_choice measures fastest here) and the packed forms they read."""
    if qweight.device.type != "cpu":
        return Int8Weight(qweight, scale)
    if plan is None:
        plan = int8_choice.plan(*qweight.shape)
    return with_forms(qweight, scale, plan)


# The module a layer's int8 form is registered as (`use_int8`): the layer's own, so the form lives and dies with
# the layer and each model of a pool replica has its own; its buffers are in no state dict.
INT8_SLOT = "weight_int8"
OUTPUT_INT8_SLOT = (
    "output_projection_int8"  # a model's, for its output projection where that is tied to an embedding table
)


def use_int8(
    owner: nn.Module, weight: torch.Tensor, saved: Int8Weight | None = None, slot: str = INT8_SLOT
) -> Int8Weight:
    """From now on `owner`'s GEMM by `weight` runs in int8 (on CPU, outside autograd; model/kernels/gemm.py's
    linear is handed `int8_of(owner)`): by `saved` where given (an int8 checkpoint's), else by `weight`
    quantised now; registered as owner's module `slot`."""
    found = int8_of(owner, slot)
    if found is not None and saved is None:
        return found
    q = saved if saved is not None else quantize_weight(weight)
    owner.add_module(slot, q)
    return q


def int8_of(owner: nn.Module, slot: str = INT8_SLOT) -> Int8Weight | None:
    """owner's int8 form (use_int8), or None. Read from the module dict: a decode step asks for every layer."""
    found: Int8Weight | None = owner._modules.get(slot)  # type: ignore[assignment]
    return found


def linear_int8(
    x: torch.Tensor,
    q: Int8Weight,
    bias: torch.Tensor | None = None,
    *,
    log_softmax: bool = False,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """x (..., K) @ weight^T + bias with int8 operands: x quantised per row, the int32 product scaled
    back per row and per column; plus `residual` (..., N) where given (added in float32 where x is float32, in
    x's dtype otherwise, as `residual + y` would). Returns (..., N) in x's dtype; with `log_softmax`, each
    row's log-softmax (float32, model.kernels.log_softmax.log_softmax_), in C where the C kernels run."""
    flat = x.dim() == 2  # a decode step's rows: no views to make (each costs a microsecond)
    rows = x if flat else x.reshape(-1, x.shape[-1])  # (M, K)
    if bias is not None and bias.dtype != torch.float32:  # a decode step makes ~20 calls: no needless ops
        bias = bias.float()
    kernel = int8_choice.kernel_at(q.plan, rows.shape[0])
    in_c = log_softmax and native.scales_back() and native.runs_on(x)
    fused = residual is not None and x.dtype == torch.float32 and residual.dtype == torch.float32
    if fused and not flat:
        residual = residual.reshape(rows.shape[0], -1)  # type: ignore[union-attr]
    y = multiply(kernel, rows, q, bias, in_c, residual if fused else None)
    if not flat:
        y = y.view(*x.shape[:-1], -1)
    if in_c:
        return y
    y = _out(y, x.dtype, log_softmax)
    return y if residual is None or fused else residual + y


def _out(y: torch.Tensor, dtype: torch.dtype, log_softmax: bool) -> torch.Tensor:
    """y (float32) in x's dtype, then its log-softmax where asked (of the logits as that dtype has them)."""
    y = y if dtype == torch.float32 else y.to(dtype)
    return log_softmax_(y) if log_softmax else y
