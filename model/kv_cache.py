"""Decoder caches: preallocated self-attention keys/values and once-computed cross-attention keys/values."""

from __future__ import annotations

from dataclasses import dataclass

import torch


class KVCache:
    """Self-attention keys/values of every decoder layer, preallocated and written in place.

    Rows are decoder hypotheses (sentences x beams). Shapes never change while decoding: finished
    rows are compacted to the front and `rows` shrinks, positions fill up to `length`.
    """

    def __init__(
        self, layers: int, rows: int, heads: int, max_length: int, head_dim: int,
        *, dtype: torch.dtype, device: torch.device,
    ) -> None:
        shape = (layers, rows, heads, max_length, head_dim)  # (L, N, H, T_max, D)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.rows = rows
        self.length = 0  # positions written so far (the same for every row)

    @property
    def max_length(self) -> int:
        return self.k.shape[3]

    def update(self, layer: int, pos: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (N, H, 1, D) at `pos`; return views of positions [0, pos] as (N, H, pos+1, D)."""
        if pos >= self.max_length:
            raise IndexError(f"position {pos} is past the cache's {self.max_length} positions")
        n = self.rows
        self.k[layer, :n, :, pos] = k[:, :, 0]
        self.v[layer, :n, :, pos] = v[:, :, 0]
        self.length = max(self.length, pos + 1)
        return self.k[layer, :n, :, : pos + 1], self.v[layer, :n, :, : pos + 1]

    def reorder(self, rows: torch.Tensor) -> None:
        """Keep rows `rows` (N',) in that order (beam reordering and dropping finished rows in one gather)."""
        t = self.length
        n = rows.numel()
        # Beams often keep their place: copy only rows whose source differs, and only the filled prefix.
        moved = (rows != torch.arange(n, device=rows.device)).nonzero()[:, 0]
        if moved.numel():
            src = rows[moved]
            self.k[:, moved, :, :t] = self.k[:, src, :, :t]
            self.v[:, moved, :, :t] = self.v[:, src, :, :t]
        self.rows = n


@dataclass
class CrossCache:
    """Encoder-decoder attention keys/values, projected once per sentence (not per beam)."""

    k: list[torch.Tensor]  # per layer (B, H, S, D)
    v: list[torch.Tensor]  # per layer (B, H, S, D)
    src_mask: torch.Tensor  # (B, 1, 1, S) True where the source token is real

    def select(self, sentences: torch.Tensor) -> None:
        """Keep only `sentences` (B',), e.g. when others have finished."""
        self.k = [k.index_select(0, sentences) for k in self.k]
        self.v = [v.index_select(0, sentences) for v in self.v]
        self.src_mask = self.src_mask.index_select(0, sentences)
