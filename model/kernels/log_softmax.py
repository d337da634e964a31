"""The log-softmax of a decode step's logits, in one pass where the C kernels run: the search's scores."""

from __future__ import annotations

import torch

from model.kernels import native, ops


def log_softmax_(logits: torch.Tensor) -> torch.Tensor:
    """log_softmax over the vocabulary in float32; contiguous float32 logits on CPU are overwritten.

    Where the C kernels run, one pass a row with its own bits (model/kernels/native.py); elsewhere ATen's fused
    kernel, about 5x faster on CPU (256 x 8000 logits) than an in-place x - logsumexp(x), whose separate
    amax/sub/exp/sum passes each read the whole (N, V) tensor. On CPU it writes over the logits (not needed
    afterwards; the kernel has a row's maximum and sum before it writes the row, so the values are the same
    to the bit): one (N, V) buffer fewer.
    """
    x = logits.float()
    if x.device.type == "cpu" and x.is_contiguous():
        if native.runs_on(x):
            return ops.log_softmax_(x)
        return torch.log_softmax(x, dim=-1, out=x)
    return torch.log_softmax(x, dim=-1)
