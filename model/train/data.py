"""Parallel text loading and token-budget batching for training."""

from __future__ import annotations

import gzip
import random
from collections.abc import Iterator
from pathlib import Path

import torch


def read_text(path: Path) -> list[str]:
    """One sentence a line, plain or gzip-compressed UTF-8."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def split_path(data_dir: Path, split: str, lang: str) -> Path:
    for name in (f"{split}.{lang}.gz", f"{split}.{lang}"):
        if (data_dir / name).exists():
            return data_dir / name
    raise FileNotFoundError(f"no {split}.{lang}[.gz] in {data_dir}")


def token_batches(
    pairs: list[tuple[list[int], list[int]]],
    max_tokens: int,
    *,
    seed: int,
    shuffle: bool = True,
) -> list[list[int]]:
    """Group pair indices into batches of at most max_tokens padded tokens (the larger side counts)."""
    rng = random.Random(seed)
    # Sort by length with a little noise so batches differ between epochs but padding stays low.
    key = [max(len(s), len(t)) + (rng.random() if shuffle else 0.0) for s, t in pairs]
    order = sorted(range(len(pairs)), key=lambda i: key[i])
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        length = max(len(pairs[i][0]), len(pairs[i][1]))
        if current and max(longest, length) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, length)
    if current:
        batches.append(current)
    if shuffle:
        rng.shuffle(batches)
    return batches


def collate(
    pairs: list[tuple[list[int], list[int]]],
    pad: int,
    start: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> src_ids (B, S), src_mask (B, S), tgt_in (B, T) starting with the start token, labels (B, T)."""
    B = len(pairs)
    S = max(len(s) for s, _ in pairs)
    T = max(len(t) for _, t in pairs)
    src = torch.full((B, S), pad, dtype=torch.long)
    tgt_in = torch.full((B, T), pad, dtype=torch.long)
    labels = torch.full((B, T), pad, dtype=torch.long)
    for i, (s, t) in enumerate(pairs):
        src[i, : len(s)] = torch.tensor(s)
        tgt_in[i, 0] = start
        tgt_in[i, 1 : len(t)] = torch.tensor(t[:-1])
        labels[i, : len(t)] = torch.tensor(t)
    lengths = torch.tensor([len(s) for s, _ in pairs])
    mask = torch.arange(S)[None, :] < lengths[:, None]
    return src.to(device), mask.to(device), tgt_in.to(device), labels.to(device)


def iterate(batches: list[list[int]], start: int) -> Iterator[tuple[int, list[int]]]:
    """Batches from index start on (resuming mid-epoch)."""
    for i in range(start, len(batches)):
        yield i, batches[i]
