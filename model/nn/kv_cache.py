"""Decoder caches: preallocated self-attention keys/values and once-computed cross-attention keys/values."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from model.kernels import c_attention, c_layers, execution, ops
from model.nn.layers import attended_keys


class KVCache:
    """Self-attention keys/values of every decoder layer, preallocated and written in place.

    Rows are decoder hypotheses (sentences x beams), always the first `rows` of the buffer: finished
    rows are compacted away by `reorder`. Every row may sit at its own position (continuous batching,
    where sentences join at different steps); positions fill up to `length`. The position capacity
    starts at `max_length` and doubles when a row passes it (a rare copy, never a per-step one).
    On CPU PyTorch's attention reads up to `layers.attended_keys` positions (the extra ones masked), so
    the buffer holds those too and a step never copies keys to pad them.

    With `lineage` (rows at one shared position, attention in C: model/kernels/native.py) a reorder copies no
    keys: `lineage[n, t]` is the buffer row holding position t of row n, a move copies those indices,
    and a step writes each row's new position into its own buffer row (a position no row has yet, so
    nothing another row reads is overwritten). Its attention reads written positions only: nothing is
    padded or zeroed.
    """

    def __init__(
        self,
        layers: int,
        rows: int,
        heads: int,
        max_length: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
        limit: int | None = None,
        zeroed: bool = False,
        lineage: bool = False,
        plan: execution.Plan | None = None,
    ) -> None:
        """`plan`: which kernels copy rows and follow lineages (the model's; default: this process's)."""
        shape = (layers, rows, heads, max_length, head_dim)  # (L, N, H, T_max, D)
        self.plan = plan or execution.probe()
        # Rows at their own positions (zeroed=True) see masked positions they never wrote: a masked
        # value still meets a 0 weight, and 0 * NaN from uninitialised memory would be NaN.
        make = torch.zeros if zeroed else torch.empty
        self.k = make(shape, dtype=dtype, device=device)
        self.v = make(shape, dtype=dtype, device=device)
        self.rows = rows
        self.length = 0  # positions written so far (the longest row)
        self.limit = limit or max_length  # the capacity may grow up to this many positions
        # PyTorch's CPU attention reads visible(length) positions; the C attention of a lineage cache reads
        # only each row's written ones.
        self.padded = device.type == "cpu" and not lineage
        # Positions below this hold no never-written memory (masked positions are read: 0 * NaN is NaN).
        self.zeroed_to = self.limit if zeroed or lineage else 0
        # (N, T_max): the buffer row holding each row's position t; None: row n holds its own
        self.lineage = torch.arange(rows, device=device)[:, None].repeat(1, max_length) if lineage else None
        # view()'s structs and the buffer they were made for (_fit makes new buffers)
        self._views: tuple[torch.Tensor, list[c_layers.KV]] | None = None

    @property
    def max_length(self) -> int:
        return self.k.shape[3]

    @property
    def capacity(self) -> int:
        """Rows the buffer holds."""
        return self.k.shape[1]

    def update(
        self,
        layer: int,
        pos: int | torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (N, H, 1, D) at `pos` (an int, or (N,) per row); return positions [0, visible(length))
        as (N, H, T', D).

        Per-row positions must be reserved first; the caller masks each row's positions past its own.
        """
        n = self.rows
        if isinstance(pos, int):
            t = self.open(pos)
            self.k[layer, :n, :, pos] = k[:, :, 0]
            self.v[layer, :n, :, pos] = v[:, :, 0]
            if self.lineage is not None and layer == 0:
                self.lineage[:n, pos] = torch.arange(n, device=self.lineage.device)
        else:  # positions reserved, the cache zeroed (Seq2Seq.new_cache(zeroed=True))
            if self.lineage is not None:
                raise ValueError("a lineage cache holds rows at one shared position")
            index = torch.arange(n, device=pos.device)
            self.k[layer, index, :, pos] = k[:, :, 0]
            self.v[layer, index, :, pos] = v[:, :, 0]
            t = self.visible(self.length)
        return self.k[layer, :n, :, :t], self.v[layer, :n, :, :t]

    def open(self, pos: int) -> int:
        """Make position pos writable for every row (rows at one shared position): the length, the capacity, and
        zeros in newly visible positions, once for every layer before any writes there. Returns visible(length)."""
        self.length = max(self.length, pos + 1)
        t = self.visible(self.length)
        self._fit(t)
        if t > self.zeroed_to:
            self.k[:, :, :, self.zeroed_to : t] = 0
            self.v[:, :, :, self.zeroed_to : t] = 0
            self.zeroed_to = t
        return t

    def view(self, layer: int) -> c_layers.KV:
        """Layer `layer`'s keys, values and lineage as c_layers.self_sublayer reads them (made once per buffer)."""
        views = self._views
        if views is None or views[0] is not self.k:
            views = (self.k, [c_layers.kv_view(self.k[i], self.v[i], self.lineage) for i in range(self.k.shape[0])])
            self._views = views
        return views[1][layer]

    def attend_step(self, layer: int, pos: int | torch.Tensor, qkv: torch.Tensor) -> torch.Tensor:
        """Layer `layer`'s self-attention of a decode step in C (c_attention.self_attend_step): each row's key and value
        from qkv (N, 3 C) written at `pos` (open()ed, or reserve()d per row), then its query against its positions
        (through the lineage, if any). -> (N, H, D)."""
        return ops.self_attend_step(qkv, self.k[layer], self.v[layer], pos, self.lineage)

    def visible(self, length: int) -> int:
        """Positions attention reads when `length` are written: on CPU up to layers.attended_keys, masked
        past `length` (within the capacity limit; beyond it the step pads a copy)."""
        return min(attended_keys(length, self.k.shape[4]), max(self.limit, length)) if self.padded else length

    def write(self, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Rows start.. take positions [0, t) from k, v (L, n, H, t, D); the live row count is not changed."""
        n, t = k.shape[1], k.shape[3]
        self._fit(t)
        self.k[:, start : start + n, :, :t] = k
        self.v[:, start : start + n, :, :t] = v
        if self.lineage is not None:  # each of these rows holds its own positions
            self.lineage[start : start + n] = torch.arange(start, start + n, device=self.lineage.device)[:, None]

    def compact(self, dest: torch.Tensor, owned: torch.Tensor, src: torch.Tensor, filled: torch.Tensor) -> None:
        """Rows leave and the rest close the gaps, each continuing a row of its own sentence: new row dest[i] (a
        permutation of [0, M)) takes over the buffer row owned[i] and continues row src[i]. Without a lineage each
        new row copies its source's filled prefix (filled (N,): positions each current row has written); with
        one, the buffer rows move (a row's positions stay readable by the rows that name it) and each new row's
        lineage is its source's, renamed to where those buffer rows went. The sources of a sentence are among
        the rows it owns."""
        if self.lineage is None:
            self.move(dest, src, filled)
            return
        renamed = torch.full((self.lineage.shape[0],), -1, dtype=torch.long, device=dest.device)
        renamed[owned] = dest
        lineage = renamed[self.lineage[src]]  # (M, T'): positions past a row's own name no buffer row (-1)
        moved = (dest != owned).nonzero()[:, 0]  # a row below M stays; the others fill the holes (fill_holes)
        if moved.numel():
            self.copy(dest[moved], owned[moved], filled)
        self.lineage[: dest.numel()].index_copy_(0, dest, lineage)
        self.rows = dest.numel()

    def reserve(self, pos: torch.Tensor) -> int:
        """Make room for rows writing at positions pos (N,); returns the length T attention will see.

        T is the furthest row's position + 1: once a long sentence leaves, shorter ones stop paying for it.
        """
        length = int(pos.max()) + 1
        self._fit(self.visible(length))
        self.length = length
        return length

    def reorder(self, rows: torch.Tensor, filled: torch.Tensor | None = None) -> None:
        """Keep rows `rows` (N',) in that order (beam reordering and dropping finished rows in one gather).

        filled (N,): positions each current row has written, where rows sit at their own positions.
        """
        self.move(torch.arange(rows.numel(), device=rows.device), rows, filled)

    def move(self, dest: torch.Tensor, src: torch.Tensor, filled: torch.Tensor | None = None) -> None:
        """Row dest[i] takes row src[i]'s filled prefix; dest (N',) is a permutation of [0, N'), the new rows.

        filled (N,), when rows sit at their own positions: only the longest moved row's prefix is copied.
        """
        if self.lineage is not None:  # which buffer rows hold the positions moves; the keys stay
            self.follow(torch.empty_like(src).index_copy_(0, dest, src))  # new row dest[i] continues src[i]
            return
        moved = (dest != src).nonzero()[:, 0]  # copy only rows whose source differs
        if moved.numel():
            self.copy(dest[moved], src[moved], filled)
        self.rows = dest.numel()

    def copy(self, dest: torch.Tensor, src: torch.Tensor, filled: torch.Tensor | None = None) -> None:
        """Row dest[i] takes row src[i]'s keys and values, each row's filled prefix where filled (N,) gives it."""
        t = self.length if filled is None else min(self.length, int(filled[src].max()))
        if self.plan.takes(self.k) and c_attention.copy_rows(self.k, self.v, dest.contiguous(), src.contiguous(), t):
            return  # a memcpy a row's head, where no row is both written and read
        # Gather then index_copy_: half the time of an index_put (k[:, dest] = k[:, src]) on CPU.
        for cache in (self.k, self.v):
            cache[:, :, :, :t].index_copy_(1, dest, cache[:, src, :, :t])

    def follow(self, rows: torch.Tensor) -> None:
        """A lineage cache's reorder: row i continues row rows[i] (N',), any rows in any order. Only the lineage
        moves: every row's next position is written into its own buffer row, which no row's lineage names
        yet at that position."""
        assert self.lineage is not None
        t = self.length
        if self.plan.c and rows.dtype == torch.int64 and rows.is_contiguous():  # one call: a step's op fewer
            c_attention.follow(self.lineage, rows, t)
        else:
            self.lineage[: rows.numel(), :t] = self.lineage[rows, :t]  # a gather first: rows may name each other
        self.rows = rows.numel()

    def resize(self, rows: int, length: int) -> None:
        """Set the live row count, and the filled length (rows joining start at their own position 0)."""
        if rows > self.capacity:
            raise IndexError(f"{rows} rows asked of a cache holding {self.capacity}")
        self.rows, self.length = rows, length

    def _fit(self, length: int) -> None:
        if length <= self.max_length:
            return
        if length > self.limit:
            raise IndexError(f"position {length - 1} is past the cache's {self.limit} positions")
        new = min(self.limit, max(length, 2 * self.max_length))
        for name in ("k", "v"):
            old = getattr(self, name)
            grown = old.new_zeros((*old.shape[:3], new, old.shape[4]))
            grown[:, :, :, : old.shape[3]] = old
            setattr(self, name, grown)
        if self.lineage is not None:
            rows = self.lineage.shape[0]
            wider = torch.arange(rows, device=self.lineage.device)[:, None].repeat(1, new)
            wider[:, : self.lineage.shape[1]] = self.lineage
            self.lineage = wider


def fill_holes(index: torch.Tensor) -> torch.Tensor:
    """New places in [0, n) for n distinct indices (n,): an index already below n keeps its place, the
    others move into the places left free, in order (so compacting moves as few rows as it can)."""
    n = index.numel()
    stays = index < n
    taken = torch.zeros(n, dtype=torch.bool, device=index.device)
    taken[index[stays]] = True
    place = index.clone()
    place[~stays] = (~taken).nonzero()[:, 0]
    return place


def continue_in_place(parents: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Cache rows for the next step's beams, so that a beam reorder copies as few rows as it can.

    parents (b, K): the cache row each sentence's new beam k continues; rows (b, K): the rows each
    sentence owns. The first beam continuing a parent that the sentence owns takes the parent's row
    (nothing to copy); the other beams take the owned rows no such beam took, in order.
    Returns (b, K), a permutation of each sentence's rows.
    """
    if parents.numel() <= SMALL_REORDER and parents.is_cpu:
        return _continue_in_place_listed(parents, rows)
    sibling = (parents[:, :, None] == parents[:, None, :]).tril(-1).any(-1)  # (b, K) parent already taken
    first = ~sibling & (parents[:, :, None] == rows[:, None, :]).any(-1)  # (b, K) keeps its parent's row
    claimed = (rows[:, :, None] == torch.where(first, parents, -1)[:, None, :]).any(-1)  # (b, K) per owned row
    free = rows.gather(1, torch.argsort(claimed.long(), dim=1, stable=True))  # unclaimed rows first
    rank = ((~first).long().cumsum(1) - 1).clamp(min=0)
    return torch.where(first, parents, free.gather(1, rank))


SMALL_REORDER = 64  # beams a reorder places in Python lists: a dozen tensor ops cost more at a few sentences


def _continue_in_place_listed(parents: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """continue_in_place over Python lists, the same rule sentence by sentence."""
    out = [continue_listed(p, r) for p, r in zip(parents.tolist(), rows.tolist(), strict=True)]
    return torch.tensor(out, dtype=parents.dtype, device=parents.device).view(parents.shape)


def continue_listed(parents: list[int], rows: list[int]) -> list[int]:
    """continue_in_place's rule for one sentence: its beams' parents and the rows it owns -> each beam's row."""
    first = [parents[k] not in parents[:k] and parents[k] in rows for k in range(len(parents))]  # keeps its parent's
    kept = {parents[k] for k in range(len(parents)) if first[k]}
    free = [row for row in rows if row not in kept] + [row for row in rows if row in kept]  # unclaimed first
    others = iter(free)
    return [parents[k] if first[k] else next(others) for k in range(len(parents))]


@dataclass
class CrossCache:
    """Encoder-decoder attention keys/values, projected once per sentence (not per beam).

    Rows of a sentence's beams attend to its keys/values as query positions: without `row_index`,
    row r belongs to sentence r // K (rows of a sentence contiguous, K the same for all); with it
    (continuous batching: any row order, beam counts per sentence), row r is query
    row_index[r] % beams of sentence row_index[r] // beams.

    With `keys_transposed` the keys are stored (B, H, D, S): on CPU a batched matmul against a
    transposed view of (B, H, S, D) keys took 3.3x as long as against this layout (the decoder's
    cross-attention shapes, 64 sentences x 4 heads). GPUs keep (B, H, S, D), the layout SDPA reads.
    """

    k: list[torch.Tensor]  # per layer (B, H, S, D), or (B, H, D, S) with keys_transposed
    v: list[torch.Tensor]  # per layer (B, H, S, D)
    src_mask: torch.Tensor  # (B, 1, 1, S) True where the source token is real
    row_index: torch.Tensor | None = None  # (N,) sentence * beams + beam of each hypothesis row
    beams: int = 0  # query positions per sentence when row_index is set
    keys_transposed: bool = False
    padded: bool = False  # source positions kept at layers.attended_keys (CPU; Seq2Seq.cross_cache)
    # row_map's last answer and what it was for: (rows, row_index); dropped as the sentences change
    _row_map: tuple[int, torch.Tensor | None, tuple[torch.Tensor, torch.Tensor]] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    # view()'s structs and the key list they were made for (select, extend and trim make new lists)
    _views: tuple[list[torch.Tensor], list[c_layers.KV]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def view(self, layer: int) -> c_layers.KV:
        """Layer `layer`'s keys and values as c_layers.cross_sublayer reads them (made once per set of sentences)."""
        views = self._views
        if views is None or views[0] is not self.k:
            views = (self.k, [c_layers.kv_view(k, v, None) for k, v in zip(self.k, self.v, strict=True)])
            self._views = views
        return views[1][layer]

    def keys(self, layer: int) -> torch.Tensor:
        """Layer `layer`'s keys as (B, H, S, D), whatever their storage."""
        k = self.k[layer]
        return k.transpose(-1, -2) if self.keys_transposed else k

    @property
    def _k_source_dim(self) -> int:
        return 3 if self.keys_transposed else 2

    def row_map(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Where the C attention (model/kernels/native.py) reads each of `rows` hypothesis rows' keys: its source length
        (rows,) and its sentence's cache row at every source position (rows, S), one row expanded."""
        held = self._row_map
        if held is not None and held[0] == rows and held[1] is self.row_index:
            return held[2]
        B, S = self.src_mask.shape[0], self.src_mask.shape[-1]
        if self.row_index is None:
            sentence = torch.arange(rows, device=self.src_mask.device) // (rows // B)  # (rows,)
        else:
            sentence = self.row_index // self.beams
        lengths = self.src_mask.view(B, S).sum(-1).index_select(0, sentence)  # (rows,)
        found = lengths, sentence[:, None].expand(rows, S)
        self._row_map = (rows, self.row_index, found)
        return found

    def select(self, sentences: torch.Tensor) -> None:
        """Keep only `sentences` (B',), e.g. when others have finished."""
        self.k = [k.index_select(0, sentences) for k in self.k]
        self.v = [v.index_select(0, sentences) for v in self.v]
        self.src_mask = self.src_mask.index_select(0, sentences)
        self._row_map = None

    def extend(self, other: CrossCache) -> None:
        """Append other's sentences (same key layout), padding the source dimension to the longer of the two."""
        S = max(self.src_mask.shape[3], other.src_mask.shape[3])
        d = self._k_source_dim
        self.k = [torch.cat([_pad(a, S, d), _pad(b, S, d)]) for a, b in zip(self.k, other.k, strict=True)]
        self.v = [torch.cat([_pad(a, S, 2), _pad(b, S, 2)]) for a, b in zip(self.v, other.v, strict=True)]
        self.src_mask = torch.cat([_pad(self.src_mask, S, 3), _pad(other.src_mask, S, 3)])
        self._row_map = None

    def place(self, other: CrossCache, slots: torch.Tensor) -> None:
        """Write other's b sentences at sentence slots (b,) of this cache, past its end where a slot is: continuous
        batching's slots, where a sentence keeps its slot while it decodes and no other sentence's keys move when
        one joins or leaves. For keys read per row over each one's own length (the C attention, row_map): what a
        slot held past its new sentence's positions stays, never read. Grows by doubling (a rare copy)."""
        if self.keys_transposed or other.keys_transposed:
            raise ValueError("place: keys in (B, H, S, D), as the C attention reads them")
        B, S = self.src_mask.shape[0], self.src_mask.shape[3]
        wanted, width = int(slots.max()) + 1, other.src_mask.shape[3]
        if wanted > B or width > S:
            self._grow(max(wanted, 2 * B) if wanted > B else B, max(width, S))
        for mine, theirs in zip(self.k + self.v, other.k + other.v, strict=True):
            mine.narrow(2, 0, width).index_copy_(0, slots, theirs)  # (b, H, width, D) into their slots
        self.src_mask.index_fill_(0, slots, False)
        self.src_mask.narrow(3, 0, width).index_copy_(0, slots, other.src_mask)
        self._row_map = None

    def _grow(self, B: int, S: int) -> None:
        """Room for B sentences of S source positions, the present ones kept at their slots."""
        B0, S0 = self.src_mask.shape[0], self.src_mask.shape[3]

        def wider(x: torch.Tensor, dim: int) -> torch.Tensor:
            shape = list(x.shape)
            shape[0], shape[dim] = B, S
            out = x.new_zeros(shape)
            out.narrow(0, 0, B0).narrow(dim, 0, S0).copy_(x)
            return out

        self.k = [wider(k, 2) for k in self.k]
        self.v = [wider(v, 2) for v in self.v]
        self.src_mask = wider(self.src_mask, 3)

    def trim(self) -> None:
        """Drop source positions no remaining sentence uses (after long sentences left)."""
        S = int(self.src_mask.sum(-1).max()) if self.src_mask.numel() else 0
        if self.padded and S:
            S = attended_keys(S, self.v[0].shape[-1])
        if 0 < S < self.src_mask.shape[3]:
            self.k = [k.narrow(self._k_source_dim, 0, S) for k in self.k]
            self.v = [v[:, :, :S] for v in self.v]
            self.src_mask = self.src_mask[..., :S]
            self._row_map = None


def _pad(x: torch.Tensor, S: int, dim: int) -> torch.Tensor:
    """Zero-pad (False for masks) dimension `dim` of x to S positions."""
    missing = S - x.shape[dim]
    if missing == 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x, x.new_zeros(shape)], dim=dim)
