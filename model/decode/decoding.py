"""Run search over a batch of encoded sources: the model side of the Stepper contract."""

from __future__ import annotations

import torch

from model.decode.search import Hypothesis, SearchOptions, Stepper, beam_search, greedy_search
from model.kernels import c_search
from model.kernels.log_softmax import log_softmax_
from model.nn.kv_cache import CrossCache, KVCache, continue_in_place, fill_holes
from model.nn.transformer import Seq2Seq, c_beam_steps


class CachedStepper:
    """Incremental decoding: encoder once, cross-attention K/V once, self-attention K/V cached in place.

    The search numbers hypothesis rows its own way (sentence-major, best beam first). The cache keeps
    each sentence's rows in a block of K, blocks and rows inside them in any order (`phys`: search row
    -> cache row), so that a reorder copies few rows: a beam continuing its parent stays where the
    parent was (only extra siblings are copied), and a finished sentence's block is refilled by the
    last block instead of shifting every block after it. A lineage cache (attention in C) copies no
    keys at all, so its rows stay in search order and a reorder gathers only the lineage; nor does a
    sentence's end move the source keys there: the rows point at their sentences' slots (row_index),
    as the C attention reads them.
    """

    def __init__(self, model: Seq2Seq, memory: torch.Tensor, src_mask: torch.Tensor, beams: int, max_length: int):
        self.model = model
        self.beams = beams
        B = src_mask.shape[0]
        self.cross: CrossCache = model.cross_cache(memory, src_mask)  # sentences in cache block order
        self.cache: KVCache = model.new_cache(B * beams, max_length, memory.dtype, memory.device, lineage=True)
        self.cache.resize(B, 0)  # one row per sentence until beam search's first reorder
        self.phys = torch.arange(B, device=memory.device)  # (N,) cache row of each search row
        self.identity = True  # phys is arange: nothing to permute
        self.slots = torch.arange(B, device=memory.device)  # (b,) cross-cache slot of each live sentence (lineage)

    def step(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        if self.identity:
            return self.model.decode_step(tokens, pos, self.cache, self.cross, log_probs=True)
        cache_tokens = torch.empty_like(tokens).index_copy_(0, self.phys, tokens)  # (N,) in cache order
        return self.model.decode_step(cache_tokens, pos, self.cache, self.cross, order=self.phys, log_probs=True)

    def beam_steps(
        self, tokens: torch.Tensor, pos: int, advance: c_search.BeamAdvance, norms: torch.Tensor
    ) -> tuple[int, c_search.BeamStep, torch.Tensor] | None:
        """Steps, their beam steps and reorders in one call where the model makes them (transformer.c_beam_steps)."""
        if not self.model.plan.steps_in_c or self.cache.lineage is None or not self.identity:
            return None
        return c_beam_steps(self.model, tokens, pos, self.cache, self.cross, advance, norms)

    def reorder(self, rows: torch.Tensor, sentences: torch.Tensor | None) -> None:
        """Search row i continues search row rows[i]; rows (b * K,) are sentence-major."""
        if self.cache.lineage is not None:  # rows stay in search order: a reorder moves only the lineage
            self.cache.follow(rows)
            if sentences is not None:  # the others' source keys stay where they are, unread
                K = self.beams
                self.slots = self.slots.index_select(0, sentences)  # (b,)
                beam = torch.arange(K, device=rows.device)
                self.cross.row_index, self.cross.beams = (self.slots[:, None] * K + beam).view(-1), K  # (b K,)
            self.phys = torch.arange(rows.numel(), device=rows.device)
            return
        K, B = self.beams, self.cross.src_mask.shape[0]
        per_old = self.phys.numel() // B  # rows per sentence before: 1 at step 0, else K
        b = rows.numel() // K
        src = self.phys[rows].view(b, K)  # (b, K) cache row each new row continues
        old_block = src[:, 0] // per_old  # (b,)
        offset = src - old_block[:, None] * per_old  # (b, K) place in the old block
        place = continue_in_place(offset, torch.arange(K, device=rows.device).expand(b, K))  # (b, K)
        new_block = fill_holes(old_block)  # (b,) blocks past b move into the holes finished sentences left
        dest = (new_block[:, None] * K + place).view(-1)
        self.cache.move(dest, src.view(-1))
        if b < B:
            self.cross.select(torch.empty_like(old_block).index_copy_(0, new_block, old_block))
        self.phys = dest
        self.identity = bool((dest == torch.arange(dest.numel(), device=dest.device)).all())


class UncachedStepper:
    """Reference decoding that recomputes the whole prefix every step (for equivalence tests)."""

    def __init__(self, model: Seq2Seq, memory: torch.Tensor, src_mask: torch.Tensor):
        self.model = model
        self.memory, self.src_mask = memory, src_mask  # (B, S, C), (B, S)
        self.sentence = torch.arange(memory.shape[0], device=memory.device)  # (N,) each row's sentence
        self.prefix = torch.empty(memory.shape[0], 0, dtype=torch.long, device=memory.device)

    def step(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        self.prefix = torch.cat([self.prefix, tokens[:, None]], dim=1)
        memory, mask = self.memory[self.sentence], self.src_mask[self.sentence]
        return log_softmax_(self.model.decode(self.prefix, memory, mask)[:, -1])

    def reorder(self, rows: torch.Tensor, sentences: torch.Tensor | None) -> None:
        self.prefix, self.sentence = self.prefix[rows], self.sentence[rows]
        if sentences is not None:
            renumber = torch.full((self.memory.shape[0],), -1, dtype=torch.long, device=rows.device)
            renumber[sentences] = torch.arange(sentences.numel(), device=rows.device)
            self.memory, self.src_mask = self.memory[sentences], self.src_mask[sentences]
            self.sentence = renumber[self.sentence]


def pad_batch(batch: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad id lists -> ids (B, S) and mask (B, S), True on real tokens."""
    S = max(len(ids) for ids in batch)
    ids = torch.full((len(batch), S), pad_id, dtype=torch.long)
    for i, seq in enumerate(batch):
        ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    lengths = torch.tensor([len(seq) for seq in batch])
    mask = torch.arange(S)[None, :] < lengths[:, None]
    return ids.to(device), mask.to(device)


def shifted(targets: list[list[int]], start: int, pad: int, device: torch.device) -> torch.Tensor:
    """Teacher forcing's decoder inputs: each target behind the start token, its last id left off, right-padded
    -> (B, T), T the longest target (at least 1). Position t's state predicts targets[b][t]."""
    width = max(1, max(map(len, targets), default=1))
    tgt_in = torch.full((len(targets), width), pad, dtype=torch.long)  # (B, T)
    tgt_in[:, 0] = start
    for i, tgt in enumerate(targets):
        tgt_in[i, 1 : len(tgt)] = torch.tensor(tgt[:-1], dtype=torch.long)
    return tgt_in.to(device)


def generate(
    model: Seq2Seq,
    src_ids: torch.Tensor,
    src_mask: torch.Tensor,
    max_lengths: torch.Tensor,
    opts: SearchOptions,
    *,
    cached: bool = True,
) -> list[list[Hypothesis]]:
    """Translate a padded batch: src_ids, src_mask (B, S); max_lengths (B,) generated-token caps."""
    memory = model.encode(src_ids, src_mask)  # (B, S, C)
    K = opts.beam_size
    stepper: Stepper
    if cached:
        stepper = CachedStepper(model, memory, src_mask, K, int(max_lengths.max()))
    else:
        stepper = UncachedStepper(model, memory, src_mask)
    if K == 1:
        return greedy_search(stepper, max_lengths, opts)
    return beam_search(stepper, max_lengths, opts, model.plan)
