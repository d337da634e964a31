"""Scoring a given translation: each of its tokens' log-probability under the model, teacher-forced (the
model reads the source and the target's tokens before each one), as CTranslate2's score_batch and a
Hugging Face forward pass with labels give them. A translation memory's match is checked by it
(service/routing/pair_decoder.py): a unit's target the model finds far less likely than its own
translation says something else."""

from __future__ import annotations

import torch

from model.decode.decoding import pad_batch, shifted
from model.nn.transformer import Seq2Seq


@torch.inference_mode()
def token_log_probs(model: Seq2Seq, sources: list[list[int]], targets: list[list[int]]) -> list[list[float]]:
    """Per pair, the log-probability of each target id. sources: ids ending in </s>; targets: ids ending in
    </s> (a forced language token first where the model has them)."""
    cfg = model.cfg
    src_ids, src_mask = pad_batch(sources, cfg.pad_token_id, model.embed.weight.device)  # (B, S)
    tgt_in = shifted(targets, cfg.decoder_start_token_id, cfg.pad_token_id, src_ids.device)  # (B, T)
    states = model.decoder_states(tgt_in, model.encode(src_ids, src_mask), src_mask)  # (B, T, C)
    out = []
    for i, tgt in enumerate(targets):  # one row's (T, V) logits at a time: a batch's would be B x T x V floats
        logits = model.output(states[i, : len(tgt)]).float()  # (t, V)
        ids = torch.tensor(tgt, dtype=torch.long, device=logits.device)[:, None]  # (t, 1)
        out.append(logits.log_softmax(-1).gather(-1, ids)[:, 0].tolist())
    return out
