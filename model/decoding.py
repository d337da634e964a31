"""Run search over a batch of encoded sources: the model side of the Stepper contract."""

from __future__ import annotations

import torch

from model.kv_cache import CrossCache, KVCache
from model.search import Hypothesis, SearchOptions, Stepper, beam_search, greedy_search
from model.transformer import Seq2Seq


class CachedStepper:
    """Incremental decoding: encoder once, cross-attention K/V once, self-attention K/V cached in place."""

    def __init__(self, model: Seq2Seq, memory: torch.Tensor, src_mask: torch.Tensor, beams: int, max_length: int):
        self.model = model
        self.cross: CrossCache = model.cross_cache(memory, src_mask)
        self.cache: KVCache = model.new_cache(src_mask.shape[0] * beams, max_length, memory.dtype, memory.device)
        self.cache.resize(src_mask.shape[0], 0)  # one row per sentence until beam search's first reorder

    def step(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        return self.model.decode_step(tokens, pos, self.cache, self.cross)

    def reorder(self, rows: torch.Tensor, sentences: torch.Tensor | None) -> None:
        self.cache.reorder(rows)
        if sentences is not None:
            self.cross.select(sentences)


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
        return self.model.decode(self.prefix, memory, mask)[:, -1]

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


def generate(
    model: Seq2Seq, src_ids: torch.Tensor, src_mask: torch.Tensor, max_lengths: torch.Tensor, opts: SearchOptions,
    *, cached: bool = True,
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
    return beam_search(stepper, max_lengths, opts)
