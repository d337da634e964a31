"""int8 GEMMs for CPU inference, as CTranslate2's int8 compute type does them.

Each weight row has its own scale (quantised once, at load); each activation row gets its own scale,
computed on the fly from that row alone. The product of the two int8 matrices is exact in int32, and
each output element is then scaled by its row's and its column's scale, so a sentence's result never
depends on what it is batched with (a per-tensor activation scale, as PyTorch's dynamic quantisation
uses, would make it depend on the batch's largest value).

The int8 weight is kept as (N, K), row-major, and handed to `torch._int_mm` as its transposed view:
oneDNN's int8 GEMM (VNNI where the CPU has it) reads it in that layout without a copy.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

QMAX = 127.0  # symmetric int8: -127..127, so a row's scale maps its largest magnitude to 127


@dataclass(frozen=True)
class Int8Weight:
    """A (N, K) float weight as int8 rows and one scale per row: weight[n] ~= qweight[n] * scale[n]."""

    qweight: torch.Tensor  # (N, K) int8, contiguous
    scale: torch.Tensor  # (N,) float32

    def dequantize(self) -> torch.Tensor:
        return self.qweight.float() * self.scale[:, None]  # (N, K)


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w (R, C) float -> (R, C) int8 and (R, 1) float32 scales, each row on its own scale."""
    w = w.float()
    # amax and amin: two vectorised passes and no |w| copy (aminmax over a row is 10x slower on CPU)
    high, low = w.amax(-1, keepdim=True), w.amin(-1, keepdim=True)
    scale = torch.maximum(high, low.neg_()).clamp_min_(1e-12).div_(QMAX)  # (R, 1)
    return torch.div(w, scale).round_().to(torch.int8), scale


def quantize_weight(weight: torch.Tensor) -> Int8Weight:
    q, scale = quantize_rows(weight.detach())
    return Int8Weight(q.contiguous(), scale.squeeze(1).contiguous())


# id(weight) -> (the weight, its int8 form): which float weights compute in int8 (`use_int8`).
_int8: dict[int, tuple[weakref.ref[torch.Tensor], Int8Weight]] = {}


def use_int8(weight: torch.Tensor) -> Int8Weight:
    """From now on `model.gemm.linear` multiplies by `weight` in int8 (on CPU, outside autograd)."""
    key = id(weight)
    found = _int8.get(key)
    if found is not None and found[0]() is weight:
        return found[1]
    q = quantize_weight(weight)
    if found is None:  # forget the int8 copy with the weight (ids are reused after it is freed)
        weakref.finalize(weight, _int8.pop, key, None)
    _int8[key] = (weakref.ref(weight), q)
    return q


def int8_of(weight: torch.Tensor) -> Int8Weight | None:
    found = _int8.get(id(weight))
    return found[1] if found is not None and found[0]() is weight else None


def linear_int8(x: torch.Tensor, q: Int8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., K) @ weight^T + bias with int8 operands: x quantised per row, the int32 product scaled
    back per row and per column. Returns (..., N) in x's dtype."""
    lead, K = x.shape[:-1], x.shape[-1]
    xq, xs = quantize_rows(x.reshape(-1, K))  # (M, K) int8, (M, 1)
    acc = torch._int_mm(xq, q.qweight.t())  # (M, N) int32, exact
    # (M, N) float32 with the row scales: a conversion, then an in-place product (a mixed-type multiply
    # converts into a copy first anyway, then allocates its result)
    y = acc.to(torch.float32).mul_(xs)
    if bias is not None:
        y = torch.addcmul(bias.float(), y, q.scale, out=y)  # column scales and bias in one more pass
    else:
        y.mul_(q.scale)
    return y.view(*lead, q.qweight.shape[0]).to(x.dtype)
