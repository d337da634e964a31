"""Which kernels compute a decode step: chosen here, at the top of model/, and handed down, so that
model/decode computes with what it is given and never asks what runs.

`step_kernels("torch")` is the static step's PyTorch operators (slots.TORCH_STEP, every path's reference);
`step_kernels("triton")` computes the same attentions and constrained log-probabilities with the Triton
kernels of model/kernels/triton_step.py (on a GPU compiled; on CPU tensors only under Triton's interpreter,
for their tests). The GEMMs, LayerNorms and the beam step stay PyTorch's in both.
"""

from __future__ import annotations

import torch

from model.decode.search import SearchOptions, ban_repeated_ngrams
from model.decode.slots import TORCH_STEP, RowOptions, StepKernels

STEP_KERNELS = ("torch", "triton")


def step_kernels(name: str) -> StepKernels:
    """The step's kernels by name (STEP_KERNELS); ValueError for another."""
    if name == "torch":
        return TORCH_STEP
    if name == "triton":
        from model.kernels import triton_step  # triton: a GPU's torch has it, the CPU serving install does not

        def log_probs(logits: torch.Tensor, rows: RowOptions, opts: SearchOptions) -> torch.Tensor:
            N, V = logits.shape
            suppressed = torch.zeros(V, dtype=torch.bool, device=logits.device)
            suppressed[list(opts.suppressed_token_ids)] = True
            bans = None
            if opts.no_repeat_ngram_size:  # found as every search finds them, applied inside the kernel
                bans = torch.zeros(N, V, device=logits.device)
                ban_repeated_ngrams(bans, rows.history, rows.pos, rows.ngram, opts.no_repeat_ngram_size)
            return triton_step.constrained_log_softmax(
                logits, rows.pos, rows.max_len, rows.min_len, rows.first_token, suppressed,
                opts.eos_token_id, opts.forced_eos_token_id, bans,
            )  # fmt: skip

        def self_attention(
            q: torch.Tensor,
            k_new: torch.Tensor,
            v_new: torch.Tensor,
            k_cache: torch.Tensor,
            v_cache: torch.Tensor,
            rows_pos: torch.Tensor,
            self_mask: torch.Tensor,  # the kernel reads the positions itself
            t_len: int,
        ) -> torch.Tensor:
            return triton_step.slot_self_attention(q, k_new, v_new, k_cache, v_cache, rows_pos, t_len)

        return StepKernels("triton", self_attention, triton_step.slot_cross_attention, log_probs)
    raise ValueError(f"step kernels {name!r}: one of {', '.join(STEP_KERNELS)}")
