"""A static decode state and a decode step that is a pure function of it.

The state is a fixed pool of S sentence slots x K beams: the self-attention cache, each slot's
cross-attention keys/values and source mask, every per-sentence option as a tensor, and the beam
state. Every tensor is allocated once and only ever updated in place (admission writes into free
slots, finishing marks a slot free), so a captured CUDA graph can keep reading it. `decode_step`
runs the embedding, the decoder layers, the logits processing and the beam step for every slot at
once, with static shapes and device-side indices, and never synchronises with the host: the host
learns which slots finished from `finished` after the step (model/decode/slot_decoder.py). The layers,
the logit constraints and the beam step are the ones every search runs (model/nn/transformer.py,
model/decode/search.py), given each slot's options as tensors; only the cache layout is this module's.

Shapes: S slots, K beams, N = S * K hypothesis rows, T target positions, P source positions,
L layers, H heads, D head dim, V vocabulary, C model width.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from functools import partial
from typing import Any

import torch

from model.decode.search import NEG, BeamState, SearchOptions, beam_step, constrain, length_norms
from model.kernels.gemm import linear
from model.nn.blocks import DecoderLayer
from model.nn.layers import attention, layer_norm
from model.nn.transformer import Seq2Seq


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
    first_token: torch.Tensor  # (S,) forced_bos_token_id, -1 none
    finished: torch.Tensor  # (S,) bool: the slot's sentence finished at the last step
    # (N, T) the cache row holding position t of row n's history, where the fused step reads the cache through it
    # (FusedKernels: a beam reorder moves these indices, not keys and values); the operators' step copies rows.
    lineage: torch.Tensor
    # The fused step's n-gram bans: (N, V) bool each row's banned tokens now, and (N, T) the tokens it banned (-1:
    # none), which its next step clears first; (0, V) and (0, T) in a pool that bans none.
    bans: torch.Tensor
    banned: torch.Tensor
    # Beam state: (S, K) running and finished scores, (S, K, T) their tokens (search.BeamState).
    search: BeamState

    @classmethod
    def allocate(
        cls,
        model: Seq2Seq,
        slots: int,
        beams: int,
        target_len: int,
        source_len: int,
        *,
        device: torch.device,
        bans: bool = False,
    ) -> SlotState:
        """`bans`: the pool hosts n-gram bans (the fused step's buffers for them are allocated)."""
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
            first_token=torch.full((S,), -1, **longs),
            finished=torch.zeros(S, **bools),
            lineage=torch.arange(N, **longs)[:, None].repeat(1, T),
            bans=torch.zeros(N if bans else 0, cfg.decoder_vocab_size, **bools),
            banned=torch.full((N if bans else 0, T), -1, **longs),
            search=BeamState(
                run_scores=torch.zeros(S, K, **floats),
                run_tokens=torch.full((S, K, T), -1, **longs),
                fin_scores=torch.full((S, K), NEG, **floats),
                fin_tokens=torch.full((S, K, T), -1, **longs),
                fin_flags=torch.zeros(S, K, **bools),
                improvable=torch.ones(S, **bools),
            ),
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "search"}
        return out | {f"search.{name}": getattr(self.search, name) for name in BeamState.FIELDS}

    @property
    def beams(self) -> int:
        return int(self.search.run_scores.shape[1])

    @contextlib.contextmanager
    def kept(self) -> Iterator[None]:
        """The state as it was before the block, whatever steps the block runs on it (a warm-up, a capture)."""
        saved = {name: t.clone() for name, t in self.tensors().items()}
        yield
        for name, t in self.tensors().items():
            t.copy_(saved[name])


def torch_self_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    rows_pos: torch.Tensor,
    self_mask: torch.Tensor,
    t_len: int,
) -> torch.Tensor:
    """Each row's key and value (N, H, D) written at its position of the cache (N, H, T, D), its query (N, H, D)
    attended over the positions self_mask (N, 1, 1, t) holds -> (N, H, D)."""
    rows = torch.arange(q.shape[0], device=q.device)
    k_cache[rows, :, rows_pos] = k_new
    v_cache[rows, :, rows_pos] = v_new
    k, v = k_cache[:, :, :t_len], v_cache[:, :, :t_len]  # (N, H, t, D)
    return attention(q[:, :, None], k, v, self_mask)[:, :, 0]


def torch_cross_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, src_mask: torch.Tensor, p_len: int
) -> torch.Tensor:
    """A slot's K beams (N, H, D), N = S K, as the queries of one attention over its source (S, H, P, D) where
    src_mask (S, P) holds -> (N, H, D)."""
    N, H, D = q.shape
    S = src_mask.shape[0]
    queries = q.view(S, N // S, H, D).transpose(1, 2)  # (S, H, K, D)
    out = attention(queries, k[:, :, :p_len], v[:, :, :p_len], src_mask[:, None, None, :p_len])  # (S, H, K, D)
    return out.transpose(1, 2).reshape(N, H, D)


@dataclass(frozen=True)
class RowOptions:
    """Each hypothesis row's options at a step (N,): what the logits' constraints read."""

    pos: torch.Tensor  # tokens generated so far
    max_len: torch.Tensor
    min_len: torch.Tensor
    ngram: torch.Tensor
    first_token: torch.Tensor
    history: torch.Tensor  # (N, t) generated tokens


def torch_log_probs(logits: torch.Tensor, rows: RowOptions, opts: SearchOptions) -> torch.Tensor:
    """The constrained log-probabilities (N, V) float32 of the logits (N, V): search.constrain's, as every search
    applies them."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return constrain(
        log_probs, rows.pos, rows.max_len, opts, rows.history,
        min_lengths=rows.min_len, ngram_sizes=rows.ngram, first_tokens=rows.first_token, sync=False,
    )  # fmt: skip


@dataclass(frozen=True)
class FusedKernels:
    """A whole step in a few kernels (model/plan.py's Triton set, model/kernels/triton_step.py), each the math of
    the operators decode_step runs otherwise: the embedding and its position; each sublayer's residual sum and its
    LayerNorm; the self-attention from the fused projection, through the cache's lineage; the cross-attention; the
    constrained log-softmax with each block's greatest log-probability; the beam step with its bookkeeping."""

    embed: Callable[..., torch.Tensor]  # (tokens (N,), pos (S,), weight, table, scale, t_last) -> (N, C)
    add_layer_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]  # (x, residual, w, b, eps) -> (sum, normed)
    self_attention: Callable[..., torch.Tensor]  # (qkv (N, 3C), k, v (N, H, T, D), pos, lineage, t_len, K)
    cross_attention: Callable[..., torch.Tensor]  # as torch_cross_attention
    log_probs: Callable[..., tuple[torch.Tensor, torch.Tensor]]  # (logits, state, opts) -> (log-probs, maxima)
    advance: Callable[..., None]  # (log-probs, maxima, state, norm (S,), t_len, opts): beam step, bookkeeping


@dataclass(frozen=True)
class StepKernels:
    """What a step computes its attentions and log-probabilities with, each the same math: TORCH_STEP, PyTorch's
    operators (the reference), or another set the execution plan chooses at load (model/plan.py); with `fused`,
    the whole step in those kernels (the other three are then the set's per-operator forms)."""

    name: str
    self_attention: Callable[..., torch.Tensor]  # as torch_self_attention
    cross_attention: Callable[..., torch.Tensor]  # as torch_cross_attention
    log_probs: Callable[[torch.Tensor, RowOptions, SearchOptions], torch.Tensor]  # as torch_log_probs
    fused: FusedKernels | None = None


TORCH_STEP = StepKernels("torch", torch_self_attention, torch_cross_attention, torch_log_probs)


def decode_step(
    model: Seq2Seq,
    state: SlotState,
    opts: SearchOptions,
    t_len: int | None = None,
    p_len: int | None = None,
    kernels: StepKernels = TORCH_STEP,
) -> None:
    """One decoder step and beam step for every slot, in place; inactive slots keep their state.

    opts carries what the model fixes (the end token, the forced last token, the suppressed tokens)
    and, as no_repeat_ngram_size, the bound of `state.ngram`; the per-sentence options are the
    state's tensors. t_len and p_len (buckets: every active slot's position is below t_len and its
    source within p_len) limit the target and source positions the step reads; all three are static
    shapes. kernels: what computes the attentions and the log-probabilities.
    """
    S, K = state.search.run_scores.shape
    N = S * K
    t_len, p_len = t_len or state.search.width, p_len or state.src_mask.shape[1]
    if kernels.fused is not None:
        return _fused_step(model, state, opts, t_len, p_len, kernels.fused)

    def per_row(t: torch.Tensor) -> torch.Tensor:
        return t[:, None].expand(S, K).reshape(N)  # (S,) -> (N,)

    # (N,) each row's position; an inactive slot's may lie past t_len, and its rows' writes are moot.
    rows_pos = per_row(state.pos.clamp(max=t_len - 1))
    x = model.embed_at(state.tokens[:, None], rows_pos[:, None], target=True)  # (N, 1, C)
    self_mask = (torch.arange(t_len, device=x.device) <= rows_pos[:, None])[:, None, None, :]  # (N, 1, 1, t)
    for i, layer in enumerate(model.decoders):
        x = layer.sublayers(
            x,
            partial(_self_attention, kernels, layer, i, state, rows_pos, self_mask, t_len),
            partial(_cross_attention, kernels, layer, i, state, p_len),
        )
    options = RowOptions(
        rows_pos,
        per_row(state.max_len),
        per_row(state.min_len),
        per_row(state.ngram),
        per_row(state.first_token),
        state.search.run_tokens[:, :, :t_len].reshape(N, t_len),  # (N, t)
    )
    # Not output(log_probs=True)'s C kernel: a step traces whole (CUDA graphs).
    log_probs = kernels.log_probs(model.output(x[:, 0]), options, opts)  # (N, V)
    active = state.active
    src_beam, token, done = beam_step(
        log_probs.view(S, K, -1),
        state.search,
        state.pos,
        state.max_len,
        opts,
        length_penalty=state.length_penalty,
        early_stopping=state.early_stopping,
        active=active,
        plan=model.plan,
    )
    state.finished.copy_(active & done)
    state.pos.add_(active.long())
    active.logical_and_(~done)
    # Each row continues its source beam's cache row; the other slots (a sentence that just finished
    # included) keep theirs.
    src_beam = torch.where(active[:, None], src_beam, torch.arange(K, device=x.device))  # (S, K)
    rows = (torch.arange(S, device=x.device)[:, None] * K + src_beam).reshape(N)  # (N,)
    for cache in (state.self_k, state.self_v):
        filled = cache[:, :, :, :t_len]
        filled.copy_(filled.index_select(1, rows))
    state.tokens.copy_(torch.where(active[:, None], token, state.tokens.view(S, K)).reshape(N))


def _self_attention(
    kernels: StepKernels,
    layer: DecoderLayer,
    i: int,
    state: SlotState,
    rows_pos: torch.Tensor,
    self_mask: torch.Tensor,
    t_len: int,
    h: torch.Tensor,
    residual: torch.Tensor | None,
) -> torch.Tensor:
    """Layer i's self-attention with each row's keys/values written at its own position, plus the residual.
    h: (N, 1, C)."""
    k_new, v_new = layer.self_attn.project_kv(h)  # (N, H, 1, D)
    q = layer.self_attn.project_q(h)  # (N, H, 1, D)
    out = kernels.self_attention(
        q[:, :, 0], k_new[:, :, 0], v_new[:, :, 0], state.self_k[i], state.self_v[i], rows_pos, self_mask, t_len
    )  # (N, H, D)
    return layer.self_attn.merge_heads(out[:, :, None], residual)


def _cross_attention(
    kernels: StepKernels,
    layer: DecoderLayer,
    i: int,
    state: SlotState,
    p_len: int,
    h: torch.Tensor,
    residual: torch.Tensor | None,
) -> torch.Tensor:
    """Layer i's encoder-decoder attention over each slot's source, plus the residual. h: (N, 1, C)."""
    q = layer.cross_attn.project_q(h)  # (N, H, 1, D)
    out = kernels.cross_attention(q[:, :, 0], state.cross_k[i], state.cross_v[i], state.src_mask, p_len)
    return layer.cross_attn.merge_heads(out[:, :, None], residual)


def _fused_step(
    model: Seq2Seq, state: SlotState, opts: SearchOptions, t_len: int, p_len: int, fused: FusedKernels
) -> None:
    """decode_step's math in FusedKernels: post-norm LayerNorm(x + f(x)), pre-norm x + f(LayerNorm(x)) with the
    next norm taken in the same kernel as the sum (the stack's last, the decoder's final norm); the GEMMs as the
    model's linears compute them."""
    S = state.search.run_scores.shape[0]
    weight = (model.target_embed if model.target_embed is not None else model.embed).weight
    x = fused.embed(state.tokens, state.pos, weight, model.positions.table, model.scale, t_len - 1)  # (N, C)
    pre = model.cfg.normalize_before
    norms = [n for layer in model.decoders for n in (layer.norm1, layer.norm2, layer.norm3)]
    if pre:
        assert model.decoder_norm is not None  # a pre-norm stack ends with one
        norms.append(model.decoder_norm)
    h = layer_norm(norms[0], x) if pre else x  # the first sublayer's input
    for i, layer in enumerate(model.decoders):
        parts: tuple[Callable[[torch.Tensor], torch.Tensor], ...] = (
            partial(_fused_self_attention, fused, layer, i, state, t_len),
            partial(_fused_cross_attention, fused, layer, i, state, p_len),
            layer.ffn,
        )
        for j, sublayer in enumerate(parts):
            out = sublayer(h)  # (N, C), the residual not yet added
            norm = norms[3 * i + j + 1] if pre else norms[3 * i + j]
            summed, normed = fused.add_layer_norm(out, x, norm.weight, norm.bias, norm.eps)
            x, h = (summed, normed) if pre else (normed, normed)
    logits = linear(h, model.output_weight, model.final_logits_bias, int8=model.output_int8())  # (N, V)
    log_probs, maxima = fused.log_probs(logits, state, opts)
    lengths = length_norms(state.pos, torch.float32, state.length_penalty).view(S)  # as beam_step's
    fused.advance(log_probs, maxima, state, lengths, t_len, opts)


def _fused_self_attention(
    fused: FusedKernels, layer: DecoderLayer, i: int, state: SlotState, t_len: int, h: torch.Tensor
) -> torch.Tensor:
    """Layer i's self-attention of h (N, C), through the cache's lineage, without the residual."""
    attn = layer.self_attn
    out = fused.self_attention(
        attn.project_qkv(h), state.self_k[i], state.self_v[i], state.pos, state.lineage, t_len, state.beams
    )  # (N, H, D)
    return attn.out_proj(out.view(h.shape))


def _fused_cross_attention(
    fused: FusedKernels, layer: DecoderLayer, i: int, state: SlotState, p_len: int, h: torch.Tensor
) -> torch.Tensor:
    """Layer i's encoder-decoder attention of h (N, C) over each slot's source, without the residual."""
    attn = layer.cross_attn
    q = attn.q_proj(h).view(h.shape[0], attn.heads, -1)  # (N, H, D)
    out = fused.cross_attention(q, state.cross_k[i], state.cross_v[i], state.src_mask, p_len)
    return attn.out_proj(out.view(h.shape))
