"""oneDNN's float32 matmul on CPU (`mkldnn._linear_pointwise`) over a weight reordered once into its blocked
layout: the GEMM of model/kernels/gemm.py's linear, and the reference model/kernels/f32_gemm.py's C kernel is
checked against.

With the packed weight oneDNN computes a row to the same bits whatever other rows it is multiplied beside
(one row alone is given a zero row for company: its one-row kernel sums in another order), where MKL's
sgemm takes other kernels, summing in other orders, by the row count.
"""

from __future__ import annotations

import torch


def _onednn_op() -> object | None:
    try:  # the overload itself: calling the packet resolves it on every call (a few us each)
        return torch.ops.mkldnn._linear_pointwise.default if torch.backends.mkldnn.is_available() else None  # type: ignore[no-untyped-call]
    except (AttributeError, RuntimeError):  # a build without oneDNN
        return None


LINEAR = _onednn_op()
PACK_ROWS = 64  # row count oneDNN picks the packed layout for (any count may use it; a 1-row
# layout was slower from 16 rows up, 64 and 256 alike, in an ad hoc timing of the decoder's shapes)

# Where a weight keeps its packed copy (`packed`) and the weight's version when packed: on the weight.
PACKED_ATTR = "_beamserve_packed"


def version(weight: torch.Tensor) -> int:
    """weight's version counter; -1 for a tensor made under inference_mode (it keeps none: taken as fixed,
    as weights loaded for serving are)."""
    return -1 if weight.is_inference() else weight._version


def packed(weight: torch.Tensor) -> torch.Tensor:
    """weight (C_out, C_in) in oneDNN's blocked layout, reordered once and reused until the weight changes."""
    entry: tuple[int, torch.Tensor] | None = getattr(weight, PACKED_ATTR, None)
    v = version(weight)
    if entry is not None and entry[0] == v:
        return entry[1]
    with torch.inference_mode():
        blocked = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS)
    setattr(weight, PACKED_ATTR, (v, blocked))
    return blocked


def linear(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, post_op: str = "none") -> torch.Tensor:
    """rows (M, C_in) float32 @ weight^T + bias, then oneDNN's post-op ("none", "relu", "swish") -> (M, C_out).
    Only where LINEAR is not None."""
    if rows.shape[0] == 1:  # oneDNN's one-row kernel sums in another order than its matrix kernel
        return LINEAR(torch.cat([rows, rows.new_zeros(rows.shape)]), packed(weight), bias, post_op, [], "")[:1]  # type: ignore[operator]
    return LINEAR(rows, packed(weight), bias, post_op, [], "")  # type: ignore[operator]
