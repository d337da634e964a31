"""The Transformer's layers: an encoder layer (self-attention, feed-forward) and a decoder layer (masked
self-attention, encoder-decoder attention, feed-forward), each sublayer with its residual and LayerNorm."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from model.kernels import c_layers, execution, ops
from model.nn.config import ModelConfig
from model.nn.kv_cache import CrossCache, KVCache
from model.nn.layers import FeedForward, MultiHeadAttention, layer_norm, rows_of_a_step, step_attention


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each wrapped in residual + LayerNorm."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        C = cfg.d_model
        self.self_attn = MultiHeadAttention(C, cfg.encoder_attention_heads, cfg.attention_dropout)
        self.norm1 = nn.LayerNorm(C, eps=cfg.layer_norm_eps)
        self.ffn = FeedForward(C, cfg.encoder_ffn_dim, cfg.activation, cfg.activation_dropout)
        self.norm2 = nn.LayerNorm(C, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)
        self.pre = cfg.normalize_before
        self.plan = execution.probe()  # which kernels compute (Seq2Seq.use_plan hands the model's)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = sublayer(x, self.norm1, lambda h, r: self.self_attn(h, h, mask, residual=r), self.dropout, self.pre)
        return sublayer(x, self.norm2, self.ffn, self.dropout, self.pre)


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, feed-forward; residual + LayerNorm around each."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        C = cfg.d_model
        self.self_attn = MultiHeadAttention(C, cfg.decoder_attention_heads, cfg.attention_dropout)
        self.norm1 = nn.LayerNorm(C, eps=cfg.layer_norm_eps)
        self.cross_attn = MultiHeadAttention(C, cfg.decoder_attention_heads, cfg.attention_dropout)
        self.norm2 = nn.LayerNorm(C, eps=cfg.layer_norm_eps)
        self.ffn = FeedForward(C, cfg.decoder_ffn_dim, cfg.activation, cfg.activation_dropout)
        self.norm3 = nn.LayerNorm(C, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)
        self.pre = cfg.normalize_before
        self.plan = execution.probe()  # which kernels compute (Seq2Seq.use_plan hands the model's)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """Full recomputation over all target positions (training, reference)."""
        return self.sublayers(
            x,
            lambda h, r: self.self_attn(h, h, causal=True, residual=r),
            lambda h, r: self.cross_attn(h, memory, src_mask, residual=r),
        )

    def sublayers(self, x: torch.Tensor, self_attention: Sublayer, cross_attention: Sublayer) -> torch.Tensor:
        """The layer around its two attentions, whichever cache they read (full recomputation, the
        incremental step, the static decode state of model/decode/slots.py): residual + LayerNorm around the
        self-attention, the encoder-decoder attention and the feed-forward. x: (N, T, C) -> (N, T, C)."""
        x = sublayer(x, self.norm1, self_attention, self.dropout, self.pre)
        x = sublayer(x, self.norm2, cross_attention, self.dropout, self.pre)
        return sublayer(x, self.norm3, self.ffn, self.dropout, self.pre)

    def step(
        self,
        x: torch.Tensor,
        layer: int,
        pos: int | torch.Tensor,
        cache: KVCache,
        cross: CrossCache,
        self_mask: torch.Tensor | None = None,
        row_map: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """One new position for every hypothesis row. x: (N, 1, C) -> (N, 1, C). row_map: cross.row_map(N) where
        the attention runs in C (computed once a step for every layer); then x may also be (N, C)."""
        in_c = row_map is not None or cache.lineage is not None  # a lineage cache is read by C alone
        return self.sublayers(
            x,
            lambda h, r: self._self_step(h, layer, pos, cache, self_mask, r, in_c),
            lambda h, r: self._cross_step(h, layer, cross, row_map, r),
        )

    def _self_step(
        self,
        h: torch.Tensor,
        layer: int,
        pos: int | torch.Tensor,
        cache: KVCache,
        mask: torch.Tensor | None,
        residual: torch.Tensor | None,
        in_c: bool,
    ) -> torch.Tensor:
        attn = self.self_attn
        if in_c:  # each row writes its key and value and attends over its own positions, in one C call
            N, C = h.shape[0], h.shape[-1]
            structs = attn.c_sublayer(N, fused=True) if rows_of_a_step(h, residual, attn.plan) else None
            if structs is not None:  # and the projections and the residual in the same call
                return c_layers.self_sublayer(h, residual, *structs, cache.view(layer), pos)  # type: ignore[arg-type]
            out = cache.attend_step(layer, pos, attn.project_qkv(h.view(N, C)))  # (N, H, D)
            return attn.out_proj(out.view(h.shape), residual)
        k, v = cache.update(layer, pos, *attn.project_kv(h))  # (N, H, T, D)
        # Rows at a shared position see every cached one; rows at their own positions are masked.
        return attn.merge_heads(step_attention(attn.project_q(h), k, v, mask), residual)

    def _cross_step(
        self,
        h: torch.Tensor,
        layer: int,
        cross: CrossCache,
        row_map: tuple[torch.Tensor, torch.Tensor] | None,
        residual: torch.Tensor | None,
    ) -> torch.Tensor:
        attn = self.cross_attn
        if row_map is not None:  # in C each row attends over its sentence's source positions
            N = h.shape[0]
            structs = attn.c_sublayer(N, fused=False) if rows_of_a_step(h, residual, attn.plan) else None
            if structs is not None:  # and the projections and the residual in the same call
                return c_layers.cross_sublayer(h, residual, *structs, cross.view(layer), row_map)  # type: ignore[arg-type]
            q = attn.q_proj(h).view(N, attn.heads, -1)  # (N, H, D)
            out = ops.attend(q, cross.k[layer], cross.v[layer], *row_map)
            return attn.out_proj(out.view(h.shape), residual)
        B = cross.src_mask.shape[0]
        q = attn.project_q(h)  # (N, H, 1, D)
        N, H, _, D = q.shape
        # The K beams of a sentence share its keys/values: treat beams as query positions.
        if cross.row_index is None:
            q = q.view(B, N // B, H, D)  # (B, K, H, D), rows of a sentence contiguous
        else:  # rows in any order: scatter them to their sentence's query slots (unused slots stay 0)
            q = q.new_zeros(B * cross.beams, H, D).index_copy_(0, cross.row_index, q[:, :, 0])
            q = q.view(B, cross.beams, H, D)
        keys, values = cross.keys(layer), cross.v[layer]
        out = step_attention(q.transpose(1, 2), keys, values, cross.src_mask, cross=True)  # (B, H, K, D)
        out = out.transpose(1, 2).reshape(-1, H, 1, D)  # (B * K, H, 1, D)
        if cross.row_index is not None:
            out = out.index_select(0, cross.row_index)  # (N, H, 1, D)
        return attn.merge_heads(out, residual)


# A sublayer's function: (its input h, the residual) -> residual + f(h), or f(h) where the residual is None.
Sublayer = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]


def sublayer(x: torch.Tensor, norm: nn.LayerNorm, fn: Sublayer, dropout: nn.Dropout, pre: bool) -> torch.Tensor:
    """Residual connection around fn: post-norm LayerNorm(x + fn(x)), or pre-norm x + fn(LayerNorm(x)). Outside
    training fn adds the residual itself, in its output projection's pass where the kernel can (the same bits:
    one float addition either way)."""
    if dropout.training:  # dropout between the sublayer and the residual
        y = x + dropout(fn(layer_norm(norm, x) if pre else x, None))
        return y if pre else layer_norm(norm, y)
    if pre:
        return fn(layer_norm(norm, x), x)
    return layer_norm(norm, fn(x, x))
