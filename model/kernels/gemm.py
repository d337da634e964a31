"""Inference GEMMs: oneDNN's matmul on CPU float32 (model/kernels/onednn.py), a decode step's few rows in C where
that gives oneDNN's bits (model/kernels/f32_gemm.py), int8 by model/kernels/quant.py, F.linear everywhere else.

PyTorch's F.linear on CPU calls MKL's sgemm. On the decoder's shapes (a few hundred hypothesis rows
against a weight) oneDNN's matmul is faster, most of all for the (rows, d_model) x (d_model, vocab)
output projection (`python loadtests/bench_gemm.py`), and it fuses the feed-forward activation into
the GEMM. Each weight is reordered once into oneDNN's blocked layout instead of on every call. Every CPU
float32 inference GEMM sums as oneDNN's packed matmul does, whatever other rows it is multiplied beside,
where MKL's sgemm takes other kernels, summing in other orders, by the row count; so a sentence's
translation never depends on its batch. oneDNN's op has no autograd formula, so training (grad enabled)
and other devices and dtypes keep F.linear; results agree with it to float32 rounding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from model.kernels import f32_gemm, onednn
from model.kernels.quant import INT8_SLOT, Int8Weight, linear_int8

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"relu": F.relu, "swish": F.silu, "gelu": F.gelu}
FUSED_ACTIVATIONS = {"relu": "relu", "swish": "swish"}  # our name -> oneDNN post-op name
INPLACE_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu_,
    "swish": torch._C._nn.silu_,  # F.silu(y, inplace=True) without its Python wrapper: a step calls it per layer
}


def uses_onednn(x: torch.Tensor) -> bool:
    # Inside torch.compile the compiler picks its own GEMMs (and the packed-weight cache is not traceable).
    return (
        onednn.LINEAR is not None
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and not torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
    )


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
    int8: Int8Weight | None = None,
) -> torch.Tensor:
    """x (..., C_in) @ weight (C_out, C_in)^T + bias, then `activation` when given ("relu" or "swish"), or plus
    `residual` (..., C_out) when given (as `residual + y`: a sublayer's residual connection, added in the
    GEMM's own pass where its kernel can). `int8`: the weight's int8 form (model/kernels/quant.py's
    int8_of(layer)), which multiplies in its place on CPU outside autograd.

    Returns (..., C_out).
    """
    if activation is not None and (activation not in FUSED_ACTIVATIONS or residual is not None):
        raise ValueError(f"no fused activation {activation!r} (one of {sorted(FUSED_ACTIVATIONS)}, with no residual)")
    # The checks in the order that costs least on the decoder's path: a decode step makes ~50 such calls.
    if x.is_cpu and not torch.is_grad_enabled():
        if int8 is not None:  # compute_type int8 (model/kernels/quant.py)
            y = linear_int8(x, int8, bias, residual=residual)
            return INPLACE_ACTIVATIONS[activation](y) if activation is not None else y
        if x.dtype == torch.float32 and onednn.LINEAR is not None and not torch.compiler.is_compiling():
            rows = x.reshape(-1, x.shape[-1])
            if activation is None:  # a decode step's few rows: in C where it gives oneDNN's bits (f32_gemm.py)
                res = None if residual is None else residual.reshape(rows.shape[0], -1)
                in_c = f32_gemm.linear(rows, weight, bias, res)
                if in_c is not None:
                    return in_c.view(*x.shape[:-1], weight.shape[0])
            post_op = "none" if activation is None else FUSED_ACTIVATIONS[activation]
            y = onednn.linear(rows, weight, bias, post_op).view(*x.shape[:-1], weight.shape[0])
            return y if residual is None else y.add_(residual)  # y + residual: residual + y to the bit
    y = F.linear(x, weight, bias)
    if activation is not None:
        return ACTIVATIONS[activation](y)
    return y if residual is None else residual + y


def packed(weight: torch.Tensor) -> torch.Tensor:
    """weight in oneDNN's blocked layout, reordered once (model/kernels/onednn.py)."""
    return onednn.packed(weight)


class Linear(torch.nn.Linear):
    """nn.Linear (same parameters, same checkpoints) whose inference forward goes through `linear`, in int8 where
    the layer has its int8 form (model/kernels/quant.py's use_int8)."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        return linear(x, self.weight, self.bias, residual=residual, int8=self._modules.get(INT8_SLOT))  # type: ignore[arg-type]
