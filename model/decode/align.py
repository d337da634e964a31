"""Word alignment from the decoder's encoder-decoder attention: which source token each target token reads.

The model is run teacher-forced on a (source, translation) pair, and each target token is linked to the
source token that the last decoder layer's cross-attention, averaged over heads, weighs most in the
state that predicts it. On the shipped en-de model this links content words correctly ("roten" to
"red", "Hemd" to "shirt"); articles go to the noun they precede. Used to carry inline HTML markup over
to a translation (service/text/html_text.py), as Bergamot-style translators do with their alignments.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from model.decode.decoding import pad_batch, shifted
from model.nn.transformer import Seq2Seq


@dataclass(frozen=True)
class Link:
    target: tuple[int, int]  # a target token's character span in the target text
    source: tuple[int, int]  # the character span of the source token it attends to most (empty for </s>)


@torch.inference_mode()
def attention_alignment(model: Seq2Seq, sources: list[list[int]], targets: list[list[int]]) -> list[list[int]]:
    """Per pair, the source position each target token attends to most.

    sources: ids ending in </s>; targets: generated ids without </s>. The state at decoder position t
    (inputs: the start token and targets[:t]) is the one that predicts targets[t].
    """
    cfg = model.cfg
    src_ids, src_mask = pad_batch(sources, cfg.pad_token_id, model.embed.weight.device)  # (B, S)
    tgt_in = shifted(targets, cfg.decoder_start_token_id, cfg.pad_token_id, src_ids.device)  # (B, T)
    weights: list[torch.Tensor] = []
    cross = model.decoders[-1].cross_attn

    def capture(module: torch.nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        x, memory, mask = args[0], args[1], args[2]
        q, (k, _) = cross.project_q(x), cross.project_kv(memory)  # (B, H, T, D), (B, H, S, D)
        scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # (B, H, T, S)
        weights.append(scores.masked_fill(~mask, float("-inf")).softmax(-1).mean(1))  # (B, T, S)

    hook = cross.register_forward_hook(capture)
    try:
        model(src_ids, src_mask, tgt_in)
    finally:
        hook.remove()
    best = weights[0].argmax(-1)  # (B, T)
    return [best[i, : len(tgt)].tolist() for i, tgt in enumerate(targets)]
