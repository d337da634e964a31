"""A static decode state and a decode step that is a pure function of it.

The state is a fixed pool of S sentence slots x K beams: the self-attention cache, each slot's
cross-attention keys/values and source mask, every per-sentence option as a tensor, and the beam
state. Every tensor is allocated once and only ever updated in place (admission writes into free
slots, finishing marks a slot free), so a captured CUDA graph can keep reading it. `decode_step`
runs the embedding, the decoder layers, the logits processing and the beam step for every slot at
once, with static shapes and device-side indices, and never synchronises with the host: the host
learns which slots finished from `finished` after the step (model/slot_decoder.py).

Shapes: S slots, K beams, N = S * K hypothesis rows, T target positions, P source positions,
L layers, H heads, D head dim, V vocabulary, C model width.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F

from model.layers import attention
from model.search import CHUNK, NEG, SearchOptions, top_candidates, top_indices
from model.transformer import DecoderLayer, Seq2Seq, _sublayer


@dataclass
class SlotState:
    """Everything a decode step reads and writes; see the module docstring for the shape letters."""

    # Decoder inputs and caches.
    tokens: torch.Tensor  # (N,) each row's last token, the next step's input
    self_k: torch.Tensor  # (L, N, H, T, D) self-attention keys, written at each row's position
    self_v: torch.Tensor  # (L, N, H, T, D)
    cross_k: torch.Tensor  # (L, S, H, P, D) cross-attention keys of each slot's source
    cross_v: torch.Tensor  # (L, S, H, P, D)
    src_mask: torch.Tensor  # (S, P) True on real source tokens
    # Per-sentence options and progress.
    active: torch.Tensor  # (S,) bool: the slot holds a sentence still decoding
    pos: torch.Tensor  # (S,) tokens generated so far
    max_len: torch.Tensor  # (S,) generated-token limit, </s> included
    min_len: torch.Tensor  # (S,) tokens before </s> is allowed
    length_penalty: torch.Tensor  # (S,) float
    early_stopping: torch.Tensor  # (S,) bool
    ngram: torch.Tensor  # (S,) no_repeat_ngram_size, 0 off
    # Beam state.
    run_scores: torch.Tensor  # (S, K) accumulated log-probabilities
    run_tokens: torch.Tensor  # (S, K, T) generated so far, -1 beyond
    fin_scores: torch.Tensor  # (S, K) normalised scores of finished hypotheses, best first
    fin_tokens: torch.Tensor  # (S, K, T)
    fin_flags: torch.Tensor  # (S, K) bool: the finished slot holds a hypothesis
    improvable: torch.Tensor  # (S,) bool: a running beam could still beat the finished ones
    finished: torch.Tensor  # (S,) bool: the slot's sentence finished at the last step
    suppressed: torch.Tensor  # (X,) token ids never generated (the padding token)

    @classmethod
    def allocate(
        cls, model: Seq2Seq, slots: int, beams: int, target_len: int, source_len: int, *, device: torch.device
    ) -> SlotState:
        cfg = model.cfg
        L, H = cfg.decoder_layers, cfg.decoder_attention_heads
        D, dtype = cfg.d_model // H, model.embed.weight.dtype
        S, K, T, P, N = slots, beams, target_len, source_len, slots * beams
        longs: dict[str, Any] = {"dtype": torch.long, "device": device}
        bools: dict[str, Any] = {"dtype": torch.bool, "device": device}
        floats: dict[str, Any] = {"dtype": torch.float32, "device": device}
        src_mask = torch.zeros(S, P, **bools)
        src_mask[:, 0] = True  # free slots attend somewhere: no all-masked row, no NaN
        return cls(
            tokens=torch.full((N,), cfg.decoder_start_token_id, **longs),
            # Zeroed: masked positions still meet a 0 weight, and 0 * NaN would be NaN.
            self_k=torch.zeros(L, N, H, T, D, dtype=dtype, device=device),
            self_v=torch.zeros(L, N, H, T, D, dtype=dtype, device=device),
            cross_k=torch.zeros(L, S, H, P, D, dtype=dtype, device=device),
            cross_v=torch.zeros(L, S, H, P, D, dtype=dtype, device=device),
            src_mask=src_mask,
            active=torch.zeros(S, **bools),
            pos=torch.zeros(S, **longs),
            max_len=torch.ones(S, **longs),
            min_len=torch.zeros(S, **longs),
            length_penalty=torch.ones(S, **floats),
            early_stopping=torch.zeros(S, **bools),
            ngram=torch.zeros(S, **longs),
            run_scores=torch.zeros(S, K, **floats),
            run_tokens=torch.full((S, K, T), -1, **longs),
            fin_scores=torch.full((S, K), NEG, **floats),
            fin_tokens=torch.full((S, K, T), -1, **longs),
            fin_flags=torch.zeros(S, K, **bools),
            improvable=torch.ones(S, **bools),
            finished=torch.zeros(S, **bools),
            suppressed=torch.tensor([cfg.pad_token_id], **longs),
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def beams(self) -> int:
        return int(self.run_scores.shape[1])


def decode_step(
    model: Seq2Seq,
    state: SlotState,
    opts: SearchOptions,
    ngram_max: int,
    t_len: int | None = None,
    p_len: int | None = None,
) -> None:
    """One decoder step and beam step for every slot, in place; inactive slots keep their state.

    opts carries what the model fixes (the end token and the forced last token); the per-sentence
    options are the state's tensors. ngram_max bounds `state.ngram`. t_len and p_len (buckets: every
    active slot's position is below t_len and its source within p_len) limit the target and source
    positions the step reads; all three are static shapes.
    """
    S, K = state.run_scores.shape
    N = S * K
    t_len, p_len = t_len or state.run_tokens.shape[2], p_len or state.src_mask.shape[1]
    # (N,) each row's position; an inactive slot's may lie past t_len, and its rows' writes are moot.
    rows_pos = state.pos.clamp(max=t_len - 1)[:, None].expand(S, K).reshape(N)
    x = model.embed_at(state.tokens[:, None], rows_pos[:, None], target=True)  # (N, 1, C)
    self_mask = (torch.arange(t_len, device=x.device) <= rows_pos[:, None])[:, None, None, :]  # (N, 1, 1, t)
    cross_mask = state.src_mask[:, None, None, :p_len]  # (S, 1, 1, p)
    for i, layer in enumerate(model.decoders):
        x = _layer_step(layer, x, i, state, rows_pos, self_mask, cross_mask, t_len, p_len)
    log_probs = torch.log_softmax(model.output(x[:, 0]).float(), dim=-1)  # (N, V)
    _constrain(log_probs, state, rows_pos, opts, ngram_max, t_len)
    src_beam, token = _beam_step(log_probs.view(S, K, -1), state, opts)
    # Each row continues its source beam's cache row (inactive slots keep theirs).
    rows = (torch.arange(S, device=x.device)[:, None] * K + src_beam).reshape(N)  # (N,)
    for cache in (state.self_k, state.self_v):
        filled = cache[:, :, :, :t_len]
        filled.copy_(filled.index_select(1, rows))
    state.tokens.copy_(torch.where(state.active[:, None], token, state.tokens.view(S, K)).reshape(N))


def _layer_step(
    layer: DecoderLayer,
    x: torch.Tensor,
    i: int,
    state: SlotState,
    rows_pos: torch.Tensor,
    self_mask: torch.Tensor,
    cross_mask: torch.Tensor,
    t_len: int,
    p_len: int,
) -> torch.Tensor:
    """One decoder layer at every row's own position. x: (N, 1, C) -> (N, 1, C)."""

    def self_attn(h: torch.Tensor) -> torch.Tensor:
        k_new, v_new = layer.self_attn.project_kv(h)  # (N, H, 1, D)
        rows = torch.arange(h.shape[0], device=h.device)
        state.self_k[i, rows, :, rows_pos] = k_new[:, :, 0]
        state.self_v[i, rows, :, rows_pos] = v_new[:, :, 0]
        q = layer.self_attn.project_q(h)  # (N, H, 1, D)
        k, v = state.self_k[i, :, :, :t_len], state.self_v[i, :, :, :t_len]  # (N, H, t, D)
        return layer.self_attn.merge_heads(attention(q, k, v, self_mask))

    def cross_attn(h: torch.Tensor) -> torch.Tensor:
        q = layer.cross_attn.project_q(h)  # (N, H, 1, D)
        N, H, _, D = q.shape
        S = state.src_mask.shape[0]
        # A slot's K beams are the query positions of one attention over its source.
        q = q.view(S, N // S, H, D).transpose(1, 2)  # (S, H, K, D)
        k, v = state.cross_k[i, :, :, :p_len], state.cross_v[i, :, :, :p_len]  # (S, H, p, D)
        out = attention(q, k, v, cross_mask)  # (S, H, K, D)
        return layer.cross_attn.merge_heads(out.transpose(1, 2).reshape(N, H, 1, D))

    x = _sublayer(x, layer.norm1, self_attn, layer.dropout, layer.pre)
    x = _sublayer(x, layer.norm2, cross_attn, layer.dropout, layer.pre)
    return _sublayer(x, layer.norm3, layer.ffn, layer.dropout, layer.pre)


def _constrain(
    log_probs: torch.Tensor,
    state: SlotState,
    rows_pos: torch.Tensor,
    opts: SearchOptions,
    ngram_max: int,
    t_len: int,
) -> None:
    """search.constrain with every condition a per-row tensor. log_probs (N, V), in place."""
    S, K = state.run_scores.shape

    def per_row(t: torch.Tensor) -> torch.Tensor:
        return t[:, None].expand(S, K).reshape(-1)  # (S,) -> (N,)

    if ngram_max:
        history = state.run_tokens[:, :, :t_len].reshape(S * K, t_len)  # (N, t)
        ban_ngrams(log_probs, history, rows_pos, per_row(state.ngram), ngram_max)
    log_probs.index_fill_(1, state.suppressed, float("-inf"))
    eos = opts.eos_token_id
    too_early = rows_pos < per_row(state.min_len)  # (N,)
    log_probs[:, eos] = log_probs[:, eos].masked_fill(too_early, float("-inf"))
    if opts.forced_eos_token_id is not None:
        last = (per_row(state.max_len) == rows_pos + 1)[:, None]  # (N, 1) rows whose next token is their last
        forced = torch.full_like(log_probs[:1], float("-inf"))
        forced[0, opts.forced_eos_token_id] = 0.0
        log_probs.copy_(torch.where(last, forced, log_probs))


def ban_ngrams(log_probs: torch.Tensor, history: torch.Tensor, pos: torch.Tensor, n: torch.Tensor, n_max: int) -> None:
    """search.ban_repeated_ngrams with a size per row: n (N,), 0 for none, at most n_max.

    log_probs (N, V); history (N, T), row r's first pos[r] tokens real. An earlier n-gram whose first
    n - 1 tokens equal the row's last n - 1 bans its last token.
    """
    N, T = history.shape
    hist = F.pad(history, (0, n_max), value=-2)  # (N, T + n_max): windows may run past T
    windows = hist.unfold(1, n_max, 1)[:, :T]  # (N, T, n_max): tokens j .. j + n_max - 1
    w = torch.arange(n_max - 1, device=history.device)  # (n_max - 1,)
    tail = hist.gather(1, (pos[:, None] - (n[:, None] - 1) + w).clamp(min=0))  # (N, n_max - 1) last n - 1 tokens
    compared = w < (n[:, None] - 1)  # (N, n_max - 1) prefix places that count for this row
    same = (windows[:, :, : n_max - 1] == tail[:, None, :]) | ~compared[:, None, :]  # (N, T, n_max - 1)
    starts = torch.arange(T, device=history.device)
    match = same.all(-1) & (starts <= pos[:, None] - n[:, None]) & (n[:, None] > 0)  # (N, T)
    banned = windows.gather(2, (n - 1).clamp(min=0)[:, None, None].expand(N, T, 1))[..., 0]  # (N, T)
    bans = torch.full(match.shape, float("inf"), dtype=log_probs.dtype, device=log_probs.device)
    bans = bans.masked_fill(match, float("-inf"))
    log_probs.scatter_reduce_(1, banned.clamp(min=0), bans, reduce="amin")


def _beam_step(log_probs: torch.Tensor, state: SlotState, opts: SearchOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """search.beam_step for every slot with per-slot options; only active slots change.

    log_probs (S, K, V) -> source beam (S, K) and token (S, K) of each new running beam.
    """
    S, K, _ = log_probs.shape
    T = state.run_tokens.shape[2]
    active = state.active
    length = state.pos + 1  # (S,)
    norm = length.to(log_probs.dtype)[:, None] ** state.length_penalty[:, None]  # (S, 1)
    chunk = CHUNK if log_probs.device.type == "cpu" else None
    top_scores, top_beam, top_token = top_candidates(log_probs, state.run_scores, 2 * K, chunk=chunk)  # (S, 2K)
    at_limit = state.max_len <= length  # (S,)
    hits = (top_token == opts.eos_token_id) | at_limit[:, None]  # (S, 2K)

    running = top_scores + hits.float() * NEG
    keep = top_indices(running, K)  # (S, K)
    src_beam, token = top_beam.gather(1, keep), top_token.gather(1, keep)

    all_finished = state.fin_flags.all(1)  # (S,)
    qualifies = hits & (torch.arange(2 * K, device=hits.device) < K) & state.improvable[:, None]
    seqs = _extend(state.run_tokens, top_beam, top_token, state.pos)  # (S, 2K, T)
    merged = torch.cat([state.fin_scores, top_scores / norm + (~qualifies).float() * NEG], dim=1)  # (S, 3K)
    best = top_indices(merged, K)  # (S, K)
    fin_scores = merged.gather(1, best)
    fin_tokens = torch.cat([state.fin_tokens, seqs], dim=1).gather(1, best[:, :, None].expand(S, K, T))
    fin_flags = torch.cat([state.fin_flags, qualifies], dim=1).gather(1, best)

    run_scores = running.gather(1, keep)
    run_tokens = _extend(state.run_tokens, src_beam, token, state.pos)
    all_finished = fin_flags.all(1)
    improvable = state.improvable & (~all_finished | (run_scores[:, 0] / norm[:, 0] > fin_scores.min(1).values))
    done = ~improvable | at_limit | (state.early_stopping & all_finished)

    a1, a2, a3 = active[:, None], active[:, None, None], active
    state.fin_scores.copy_(torch.where(a1, fin_scores, state.fin_scores))
    state.fin_tokens.copy_(torch.where(a2, fin_tokens, state.fin_tokens))
    state.fin_flags.copy_(torch.where(a1, fin_flags, state.fin_flags))
    state.run_scores.copy_(torch.where(a1, run_scores, state.run_scores))
    state.run_tokens.copy_(torch.where(a2, run_tokens, state.run_tokens))
    state.improvable.copy_(torch.where(a3, improvable, state.improvable))
    state.finished.copy_(active & done)
    state.pos.add_(active.long())
    state.active.logical_and_(~done)
    identity = torch.arange(K, device=log_probs.device).expand(S, K)
    return torch.where(a1, src_beam, identity), token


def _extend(tokens: torch.Tensor, beam: torch.Tensor, token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Prefixes of beams `beam` (S, M) from tokens (S, K, T) with `token` (S, M) written at pos (S,)."""
    S, M = beam.shape
    T = tokens.shape[2]
    seqs = tokens.gather(1, beam[:, :, None].expand(S, M, T))  # (S, M, T)
    at = pos.clamp(max=T - 1)[:, None, None].expand(S, M, 1)  # a finished slot's pos may reach T
    return seqs.scatter(2, at, token[:, :, None])
