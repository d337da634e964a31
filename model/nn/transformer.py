"""Encoder, decoder and the Seq2Seq model with full and incremental (cached) decoding."""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from model.kernels import c_layers, c_linears, c_search, execution, ops
from model.kernels.gemm import Linear, linear
from model.kernels.log_softmax import log_softmax_
from model.kernels.quant import OUTPUT_INT8_SLOT, Int8Weight, int8_of, linear_int8
from model.nn import c_encode, c_step
from model.nn.blocks import DecoderLayer, EncoderLayer
from model.nn.config import ModelConfig
from model.nn.kv_cache import CrossCache, KVCache
from model.nn.layers import (
    PositionalEncoding,
    attended_keys,
    dropped,
    embedding_scale,
    side_by_side,
    weights_states,
)


def embedding(rows: int, width: int, pad: int, initialise: bool) -> nn.Embedding:
    """nn.Embedding, or one left uninitialised (its own normal_ init, on the meta device, would import
    torch._dynamo: seconds of CPU on every load)."""
    if initialise:
        return nn.Embedding(rows, width, padding_idx=pad)
    return nn.Embedding(rows, width, padding_idx=pad, _weight=torch.empty(rows, width))


class Seq2Seq(nn.Module):
    """The encoder-decoder Transformer of "Attention Is All You Need" with shared embeddings (or, as some
    Marian models have them, separate source and target vocabularies and embeddings)."""

    def __init__(self, cfg: ModelConfig, *, initialise: bool = True) -> None:
        """initialise=False leaves the weights uninitialised, for a model whose weights are loaded next."""
        super().__init__()
        self.cfg = cfg
        C, V = cfg.d_model, cfg.decoder_vocab_size  # V: the target vocabulary, the logits' width
        self.embed = embedding(cfg.vocab_size, C, cfg.pad_token_id, initialise)  # source (and target if shared)
        self.target_embed = None if cfg.share_embeddings else embedding(V, C, cfg.pad_token_id, initialise)
        self.positions = PositionalEncoding(cfg.max_position_embeddings, C, cfg.positions, cfg.pad_token_id)
        self.scale = embedding_scale(C, cfg.scale_embedding)
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        # Pre-norm stacks end with a LayerNorm; post-norm ones are already normalised.
        self.encoder_norm = nn.LayerNorm(C, eps=cfg.layer_norm_eps) if cfg.normalize_before else None
        self.decoder_norm = nn.LayerNorm(C, eps=cfg.layer_norm_eps) if cfg.normalize_before else None
        self.lm_head = None if cfg.tie_embeddings else Linear(C, V, bias=False)
        self.final_logits_bias = nn.Parameter(torch.zeros(V)) if cfg.final_logits_bias else None
        self.plan = execution.probe()  # which kernels compute: this process's until handed one (use_plan)
        if initialise:
            self.reset_parameters()

    def use_plan(self, plan: execution.Plan) -> None:
        """Compute with `plan`'s kernels from now on (model/kernels/execution.py): this model and every layer that
        reads one; the caches it makes next take it too."""
        for module in self.modules():
            if isinstance(module.__dict__.get("plan"), execution.Plan):  # an int8 form's `plan` is its kernels'
                module.__dict__["plan"] = plan

    @classmethod
    def from_state(cls, cfg: ModelConfig, state: dict[str, torch.Tensor]) -> Seq2Seq:
        """A model holding `state`'s tensors themselves: built on the meta device and left uninitialised, so
        that loading takes one copy of the weights, not two, and no time initialising them."""
        with torch.device("meta"):
            model = cls(cfg, initialise=False)
        model.load_state_dict(state, assign=True)
        return model

    @property
    def decoders(self) -> list[DecoderLayer]:
        return cast(list[DecoderLayer], list(self.decoder_layers))

    def reset_parameters(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        # Embeddings ~ N(0, 1/C), so that after the sqrt(C) scale they are ~ N(0, 1).
        for embed in (self.embed, self.target_embed):
            if embed is not None:
                nn.init.normal_(embed.weight, std=self.cfg.d_model**-0.5)
                with torch.no_grad():
                    embed.weight[self.cfg.pad_token_id].zero_()

    @property
    def output_weight(self) -> torch.Tensor:
        """The output projection (V, C): its own, or tied to the target side's embedding."""
        if self.lm_head is not None:
            return self.lm_head.weight
        return (self.target_embed or self.embed).weight

    def embed_at(self, ids: torch.Tensor, positions: torch.Tensor, *, target: bool = False) -> torch.Tensor:
        """Token embedding * sqrt(C) + sinusoid. ids: (B, T), positions broadcastable -> (B, T, C);
        target ids through the target embedding where the vocabularies are separate."""
        embed = self.target_embed if target and self.target_embed is not None else self.embed
        return dropped(self.dropout, embed(ids) * self.scale + self.positions(positions))

    def encode(self, src_ids: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """src_ids, src_mask: (B, S) -> memory (B, S, C); src_mask is True on real tokens."""
        S = src_ids.shape[1]
        self.check_length(S)
        x = self.embed_at(src_ids, torch.arange(S, device=src_ids.device))
        encoded = (
            None if self.training else c_encode.run(cast(list[EncoderLayer], list(self.encoder_layers)), x, src_mask)
        )
        if encoded is None:  # a layer not in C at B S rows: module by module
            mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
            for layer in self.encoder_layers:
                x = layer(x, mask)
        else:
            x = encoded
        return self.encoder_norm(x) if self.encoder_norm is not None else x

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """Teacher-forced decoding of every position at once. tgt_in: (B, T) -> logits (B, T, V)."""
        return self.output(self.decoder_states(tgt_in, memory, src_mask))

    def decoder_states(self, tgt_in: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """The last decoder layer's states, teacher-forced, before the output projection: (B, T) -> (B, T, C)."""
        T = tgt_in.shape[1]
        self.check_length(T)
        x = self.embed_at(tgt_in, torch.arange(T, device=tgt_in.device), target=True)
        mask = src_mask[:, None, None, :]
        for layer in self.decoder_layers:
            x = layer(x, memory, mask)
        return x

    def forward(self, src_ids: torch.Tensor, src_mask: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        return self.decode(tgt_in, self.encode(src_ids, src_mask), src_mask)

    def output(self, h: torch.Tensor, *, log_probs: bool = False) -> torch.Tensor:
        """Decoder states (..., C) -> logits (..., V) through the (tied) output projection; with `log_probs`,
        their log_softmax_ (model/kernels/log_softmax.py, float32), in one pass over the logits with the int8
        projection's scale-back where the C kernels run (the same bits)."""
        if self.decoder_norm is not None:
            h = self.decoder_norm(h)
        q = self.output_int8()
        if q is not None and log_probs and h.is_cpu and not torch.is_grad_enabled():
            return linear_int8(h, q, self.final_logits_bias, log_softmax=True)
        # One fused GEMM + bias: a separate add would make a second pass over the (N, V) logits.
        logits = linear(h, self.output_weight, self.final_logits_bias, int8=q)
        return log_softmax_(logits) if log_probs else logits

    def output_int8(self) -> Int8Weight | None:
        """The output projection's int8 form (compute_type int8): its own lm_head's, or the model's (OUTPUT_INT8_SLOT)
        for a projection tied to the embedding table."""
        return int8_of(self.lm_head) if self.lm_head is not None else int8_of(self, OUTPUT_INT8_SLOT)

    def cross_cache(self, memory: torch.Tensor, src_mask: torch.Tensor) -> CrossCache:
        """Project the encoder output once into every decoder layer's cross-attention keys/values."""
        cpu = memory.device.type == "cpu"
        positions = memory.shape[1]
        head_dim = self.cfg.d_model // self.cfg.decoder_attention_heads
        attended = attended_keys(positions, head_dim) if cpu else positions
        if attended > positions:
            # Masked positions up to what a CPU step attends over, once here (layers.step_attention).
            memory = F.pad(memory, (0, 0, 0, attended - positions))
            src_mask = F.pad(src_mask, (0, attended - positions), value=False)
        kv = self._cross_kv(memory) if cpu and memory.dtype == torch.float32 and not torch.is_grad_enabled() else None
        if kv is None:
            kv = [layer.cross_attn.project_kv(memory) for layer in self.decoders]  # (B, H, S, D) views
        # Contiguous once here, or every decoder step's batched matmul would copy them again; keys
        # transposed on CPU, where the step's q @ k^T is faster so (CrossCache).
        transposed = cpu and not self.plan.attends(memory, head_dim)  # the C kernel reads (B, H, S, D)
        keys = [(k.transpose(-1, -2) if transposed else k).contiguous() for k, _ in kv]
        values = [v.contiguous() for _, v in kv]
        return CrossCache(keys, values, src_mask[:, None, None, :], keys_transposed=transposed, padded=cpu)

    def _cross_kv(self, memory: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """Every decoder layer's cross-attention keys and values of memory (B, S, C), each (B, H, S, D) contiguous:
        the layers' k and v projections side by side as one GEMM (layers.side_by_side: the same bits as each
        layer's project_kv), then one copy into the heads' layout. None for a model without one head width."""
        layers = self.decoders
        heads = {layer.cross_attn.heads for layer in layers}
        if len(heads) != 1 or not layers:
            return None
        key, objects = weights_states([(layer.cross_attn, ("k_proj", "v_proj")) for layer in layers])
        fused = self.__dict__.get("_cross_kv_fused")
        if fused is None or fused[0] != key:
            parts = [p for layer in layers for p in (layer.cross_attn.k_proj, layer.cross_attn.v_proj)]
            fused = self.__dict__["_cross_kv_fused"] = (key, objects, side_by_side(parts))
        weight, bias, int8 = fused[2]
        (B, S, C), H = memory.shape, heads.pop()
        y = linear(memory, weight, bias, int8=int8)  # (B, S, L 2 C)
        y = y.view(B, S, len(layers), 2, H, C // H).permute(2, 3, 0, 4, 1, 5).contiguous()  # (L, 2, B, H, S, D)
        return [(y[i, 0], y[i, 1]) for i in range(len(layers))]

    def new_cache(
        self,
        rows: int,
        max_length: int,
        dtype: torch.dtype,
        device: torch.device,
        *,
        limit: int | None = None,
        zeroed: bool = False,
        lineage: bool = False,
    ) -> KVCache:
        """A self-attention cache of `rows` rows and `max_length` positions (growing up to `limit`);
        `lineage`: reorders move row indices, not keys (KVCache), where attention runs in C."""
        cfg = self.cfg
        heads = cfg.decoder_attention_heads
        return KVCache(
            cfg.decoder_layers,
            rows,
            heads,
            max_length,
            cfg.d_model // heads,
            dtype=dtype,
            device=device,
            limit=limit,
            zeroed=zeroed,
            lineage=lineage and self.plan.attends(self.embed.weight, cfg.d_model // heads) and device.type == "cpu",
            plan=self.plan,
        )

    def decode_step(
        self,
        tokens: torch.Tensor,
        pos: int | torch.Tensor,
        cache: KVCache,
        cross: CrossCache,
        order: torch.Tensor | None = None,
        *,
        log_probs: bool = False,
    ) -> torch.Tensor:
        """Decode one position incrementally.

        Args:
            tokens: (N,) the token at position `pos` of every hypothesis row.
            pos: the position being decoded (0 for the decoder start token): one int for all rows,
                or (N,) per row when rows started at different steps (continuous batching).
            cache: self-attention cache holding each row's earlier positions; position pos is written.
            cross: cross-attention keys/values of the B sentences and which sentence each row is.
            order: (N,) return the rows' logits in this order (cheaper on the (N, C) states than on logits).
            log_probs: return log-probabilities (Seq2Seq.output) instead of logits.
        Returns:
            logits (N, V) for position pos + 1, or their log-softmax.
        """
        head_dim = self.cfg.d_model // self.cfg.decoder_attention_heads
        weight = (self.target_embed or self.embed).weight
        if self.plan.attends(weight, head_dim) and not cross.keys_transposed and tokens.is_cpu:
            return c_step_in_c(self, tokens, pos, cache, cross, order, log_probs)
        self_mask = None
        if isinstance(pos, int):
            self.check_length(pos + 1)
            positions = torch.tensor([pos], device=tokens.device)
            written = max(cache.length, pos + 1)
            visible = cache.visible(written)
            if visible > written:  # CPU: masked positions after the written ones (KVCache)
                self_mask = torch.arange(visible, device=tokens.device) < written  # (T',)
        else:
            T = cache.reserve(pos)
            self.check_length(T)
            positions = pos[:, None]  # (N, 1)
            columns = torch.arange(cache.visible(T), device=pos.device)
            self_mask = (columns <= positions)[:, None, None, :]  # (N, 1, 1, T')
        x = self.embed_at(tokens[:, None], positions, target=True)  # (N, 1, C)
        for i, layer in enumerate(self.decoders):
            x = layer.step(x, i, pos, cache, cross, self_mask)
        h = x[:, 0] if order is None else x[:, 0].index_select(0, order)  # (N, C)
        return self.output(h, log_probs=log_probs)

    def check_length(self, length: int) -> None:
        """ValueError for a sequence of `length` tokens past the model's positions."""
        if length > self.cfg.max_position_embeddings:
            raise ValueError(
                f"sequence of {length} tokens is longer than the model's {self.cfg.max_position_embeddings} positions"
            )


# Seq2Seq's decode step through the library (model/kernels/native.py): the embedding in one call, the decoder
# layers as c_step makes them, and the output projection with its log-softmax inside the layers' call where it
# serves; and a beam search's steps while every sentence goes on, as one call (c_search.beam_steps). decode_step
# takes this path where the model's plan attends in C; the operations are the masked path's, row by row, so the
# bits are the same (tests/test_native.py).


def c_output(model: Seq2Seq, rows: int) -> c_layers.LinearC | None:
    """The output projection as a library struct, where `output(h, log_probs=True)` of `rows` rows would run a C
    kernel (int8: VNNI, output_int8's plan at that row count; float32: f32_gemm's, where it gives oneDNN's bits)
    and the C log-softmax, with no final norm: the same calls, made inside the step's one call
    (c_step.run). Made once per weight form and bias."""
    q = model.output_int8()
    bias = model.final_logits_bias
    if model.decoder_norm is not None or (
        bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous())
    ):
        return None
    form = c_linears.output_form(q, model.output_weight, rows, model.plan)
    if form is None:
        return None
    held = model.__dict__.get("_c_output")
    if held is None or held[0] is not form or held[1] is not bias:
        struct, tensors = c_layers.c_linear(form, None if bias is None else bias.detach())
        held = model.__dict__["_c_output"] = (form, bias, struct, tensors)
    return held[2]


def c_step_in_c(
    model: Seq2Seq,
    tokens: torch.Tensor,
    pos: int | torch.Tensor,
    cache: KVCache,
    cross: CrossCache,
    order: torch.Tensor | None,
    log_probs: bool,
) -> torch.Tensor:
    """decode_step with every attention in C (model/kernels/native.py) and each row as a (C,) vector: no
    masks, each row reads its own positions. The same operations as the masked path, row by row."""
    if isinstance(pos, int):
        model.check_length(pos + 1)
        cache.open(pos)
        at = model.positions.table[pos : pos + 1]  # (1, C): every row's sinusoid
    else:
        model.check_length(cache.reserve(pos))
        at = model.positions.table.index_select(0, pos)  # (N, C)
    weight = (model.target_embed if model.target_embed is not None else model.embed).weight
    if model.training or weight.dtype != torch.float32:
        x = dropped(model.dropout, F.embedding(tokens, weight) * model.scale + at)  # (N, C)
    else:  # the same in one call
        x = ops.embed(tokens.contiguous(), weight, model.scale, at)
    row_map = cross.row_map(x.shape[0])
    # The projection and the log-softmax join the layers' one call where it serves.
    output = None if model.training or not log_probs or order is not None else c_output(model, x.shape[0])
    stepped = None if model.training else c_step.run(model.decoders, x, pos, cache, cross, row_map, output)
    if stepped is None:  # a sublayer not in C at this row count: layer by layer
        for i, layer in enumerate(model.decoders):
            x = layer.step(x, i, pos, cache, cross, None, row_map)
    elif stepped[1]:
        return stepped[0]  # (N, V) log-probabilities
    else:
        x = stepped[0]
    h = x if order is None else x.index_select(0, order)  # (N, C)
    return model.output(h, log_probs=log_probs)


def c_beam_steps(
    model: Seq2Seq,
    tokens: torch.Tensor,
    pos: int,
    cache: KVCache,
    cross: CrossCache,
    advance: c_search.BeamAdvance,
    norms: torch.Tensor,
) -> tuple[int, c_search.BeamStep, torch.Tensor] | None:
    """A beam search's steps from pos (>= 1) while every sentence goes on, each step decode_step's with its
    log-probabilities, then `advance`, then the lineage's reorder (KVCache.follow) to the rows the new beams
    continue, all in one library call (c_search.beam_steps): the calls decode_step makes one at a time where
    the step is one call (c_step_in_c), so the same bits. tokens (N,) as decode_step takes them, replaced by
    the next step's where the steps went on; norms (S,) each step's `advance` norm, at most S steps, fewer
    where the cache or the positions end. Returns the steps taken, the last one's `advance` answer and
    log-probabilities (N, V); None, having computed nothing, where a step would not be one call."""
    weight = (model.target_embed if model.target_embed is not None else model.embed).weight
    table = model.positions.table
    N, steps = tokens.numel(), min(norms.numel(), cache.max_length - pos, table.shape[0] - pos)
    if (
        model.training or steps < 1 or pos < 1 or cache.lineage is None or cross.keys_transposed
        or weight.dtype != torch.float32 or not tokens.is_cpu
        or not model.plan.attends(weight, model.cfg.d_model // model.cfg.decoder_attention_heads)
    ):  # fmt: skip
        return None
    model.check_length(pos + steps)
    cache.open(pos)  # every step's position is within the buffer: opening the first opens them all
    output = c_output(model, N)
    if output is None:
        return None
    layers = c_step.one_call(model.decoders, N, model.cfg.d_model, cache, cross, cross.row_map(N))
    if layers is None:
        return None
    at = table[pos : pos + steps]  # (steps, C)
    ran = c_search.beam_steps(*layers, weight, model.scale, at, output, advance, tokens, pos, norms[:steps])
    cache.length = max(cache.length, pos + ran[0])
    return ran
