"""Inference GEMMs: oneDNN's matmul on CPU float32, F.linear everywhere else.

PyTorch's F.linear on CPU calls MKL's sgemm. On the decoder's shapes (a few hundred hypothesis rows
against a weight) oneDNN's matmul is faster, most of all for the (rows, d_model) x (d_model, vocab)
output projection (`python loadtests/bench_gemm.py`), and it fuses the feed-forward activation into
the GEMM. Each weight is reordered once into oneDNN's blocked layout (`packed`) instead of on every
call; the packed copy is redone when the weight changes (its version counter moves). Every CPU
float32 inference GEMM takes it, small ones included: with the packed weight, oneDNN computes a row
to the same bits whatever other rows it is multiplied beside (one row alone is given a zero row
for company), where MKL's sgemm takes other kernels, summing in other orders, by the row count; so a
sentence's translation never depends on its batch. The op has no autograd formula, so training
(grad enabled) and other devices and dtypes keep F.linear; results agree with it to float32 rounding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from model.kernels.quant import int8_of, linear_int8


def _onednn_op() -> object | None:
    try:  # the overload itself: calling the packet resolves it on every call (a few us each)
        return torch.ops.mkldnn._linear_pointwise.default if torch.backends.mkldnn.is_available() else None  # type: ignore[no-untyped-call]
    except (AttributeError, RuntimeError):  # a build without oneDNN
        return None


_LINEAR = _onednn_op()
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"relu": F.relu, "swish": F.silu, "gelu": F.gelu}
FUSED_ACTIVATIONS = {"relu": "relu", "swish": "swish"}  # our name -> oneDNN post-op name
INPLACE_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu_,
    "swish": lambda y: F.silu(y, inplace=True),
}
PACK_ROWS = 64  # row count oneDNN picks the packed layout for (any count may use it; a 1-row
# layout was slower from 16 rows up, 64 and 256 alike, in an ad hoc timing of the decoder's shapes)

# Where a weight keeps its packed copy (`packed`) and the weight's version when packed: on the weight.
PACKED_ATTR = "_beamserve_packed"


def uses_onednn(x: torch.Tensor) -> bool:
    # Inside torch.compile the compiler picks its own GEMMs (and the packed-weight cache is not traceable).
    return (
        _LINEAR is not None
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
) -> torch.Tensor:
    """x (..., C_in) @ weight (C_out, C_in)^T + bias, then `activation` when given ("relu" or "swish"), or plus
    `residual` (..., C_out) when given (as `residual + y`: a sublayer's residual connection, added in the
    GEMM's own pass where its kernel can).

    Returns (..., C_out).
    """
    if activation is not None and (activation not in FUSED_ACTIVATIONS or residual is not None):
        raise ValueError(f"no fused activation {activation!r} (one of {sorted(FUSED_ACTIVATIONS)}, with no residual)")
    # The checks in the order that costs least on the decoder's path: a decode step makes ~50 such calls.
    if x.is_cpu and not torch.is_grad_enabled():
        q = int8_of(weight)
        if q is not None:  # compute_type int8 (model/kernels/quant.py)
            y = linear_int8(x, q, bias, residual=residual)
            return INPLACE_ACTIVATIONS[activation](y) if activation is not None else y
        if x.dtype == torch.float32 and _LINEAR is not None and not torch.compiler.is_compiling():
            rows = x.reshape(-1, x.shape[-1])
            post_op = "none" if activation is None else FUSED_ACTIVATIONS[activation]
            if rows.shape[0] == 1:  # oneDNN's one-row kernel sums in another order than its matrix kernel
                y = _LINEAR(torch.cat([rows, rows.new_zeros(rows.shape)]), packed(weight), bias, post_op, [], "")[:1]  # type: ignore[operator]
            else:
                y = _LINEAR(rows, packed(weight), bias, post_op, [], "")  # type: ignore[operator]
            y = y.view(*x.shape[:-1], weight.shape[0])
            return y if residual is None else y.add_(residual)  # y + residual: residual + y to the bit
    y = F.linear(x, weight, bias)
    if activation is not None:
        return ACTIVATIONS[activation](y)
    return y if residual is None else residual + y


def packed(weight: torch.Tensor) -> torch.Tensor:
    """weight (C_out, C_in) in oneDNN's blocked layout, reordered once and reused until the weight changes."""
    entry: tuple[int, torch.Tensor] | None = getattr(weight, PACKED_ATTR, None)
    # Tensors made under inference_mode keep no version counter: taken as fixed (weights loaded for serving).
    version = -1 if weight.is_inference() else weight._version
    if entry is not None and entry[0] == version:
        return entry[1]
    with torch.inference_mode():
        blocked = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS)
    setattr(weight, PACKED_ATTR, (version, blocked))
    return blocked


class Linear(torch.nn.Linear):
    """nn.Linear (same parameters, same checkpoints) whose inference forward goes through `linear`."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        return linear(x, self.weight, self.bias, residual=residual)
