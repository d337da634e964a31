"""Continuous batching: sentences join and leave the running decode batch between decoder steps.

An `InflightBatch` owns a fixed pool of hypothesis rows (each beam of each sentence holds one row of
the preallocated self-attention cache) and the cross-attention keys/values of its sentences, computed
once when a sentence joins. `step()` runs one decoder step for every row, advances each sentence's
search and returns the sentences that finished; their rows are free before the next step.

Sentences with different decoding options (beam size, length penalty, ...) decode in the same
decoder step; their searches run as separate groups, one vectorised `beam_step` per group. Beam
size 1 runs the same beam step with one beam, which picks the arg-max like greedy search. Every
sentence gets exactly the search it would get alone: rows see only their own positions (per-row
self-attention masks), their own source (per-sentence cross-attention) and their own search state.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch

from model.decode.decoding import pad_batch
from model.decode.search import (
    BeamState,
    Hypothesis,
    SearchOptions,
    advance_in_c,
    beam_step,
    constrain,
    finished_hypotheses,
    length_norms,
)
from model.kernels import c_search, execution
from model.nn.kv_cache import SMALL_REORDER, CrossCache, KVCache, continue_in_place, continue_listed, fill_holes
from model.nn.layers import attended_keys
from model.nn.transformer import Seq2Seq

TOKEN_WIDTH = 32  # starting width of a group's token buffers (BeamState), doubled as sentences get longer


@dataclass
class SearchGroup:
    """The sentences that share one set of search options; rows of sentence i are rows[i]."""

    opts: SearchOptions
    state: BeamState
    keys: list[Hashable]  # (b,) the caller's handle of each sentence
    rows: torch.Tensor  # (b, K) cache rows of each sentence's beams
    pos: torch.Tensor  # (b,) tokens generated so far
    max_lengths: torch.Tensor  # (b,) generated-token limit
    sentence: torch.Tensor  # (b,) index into the cross-attention cache

    @classmethod
    def empty(cls, opts: SearchOptions, width: int, device: torch.device) -> SearchGroup:
        none = torch.empty(0, dtype=torch.long, device=device)
        K = opts.beam_size
        return cls(opts, BeamState.start(0, K, width, device), [], none.view(0, K), none, none, none)

    def join(
        self,
        keys: list[Hashable],
        rows: torch.Tensor,
        max_lengths: torch.Tensor,
        sentence: torch.Tensor,
        state: BeamState,
        pos: torch.Tensor,
    ) -> None:
        """Append newly encoded sentences: rows (b, K), max_lengths (b,), sentence (b,), their search
        state and tokens generated so far pos (b,)."""
        self.state.extend(state)
        self.keys += keys
        self.rows = torch.cat([self.rows, rows])
        self.pos = torch.cat([self.pos, pos])
        self.max_lengths = torch.cat([self.max_lengths, max_lengths])
        self.sentence = torch.cat([self.sentence, sentence])

    def advance(self, log_probs: torch.Tensor, plan: execution.Plan) -> c_search.BeamAdvance | None:
        """The group's beam step as one C call (search.advance_in_c) over its state as it is now; None where the
        plan's kernels do not run it. Kept while the state's tensors are the same ones (a join, a drop or a
        widening makes new ones; the call updates them in place) and the plan the same."""
        tensors = (*(getattr(self.state, name) for name in BeamState.FIELDS), self.max_lengths, plan)
        key = tuple(id(t) for t in tensors)
        held = self.__dict__.get("_advance")
        if held is None or held[0] != key:
            held = (key, advance_in_c(log_probs, self.state, self.max_lengths, self.opts, plan), tensors)
            self.__dict__["_advance"] = held
        return held[1]

    def select(self, keep: torch.Tensor) -> None:
        self.state.select(keep)
        self.keys = [self.keys[i] for i in keep.tolist()]
        self.rows, self.pos = self.rows[keep], self.pos[keep]
        self.max_lengths, self.sentence = self.max_lengths[keep], self.sentence[keep]


class InflightBatch:
    """The sentences being decoded right now, on one model; not thread-safe (one owner thread)."""

    def __init__(self, model: Seq2Seq, *, rows: int, max_length: int) -> None:
        """rows: hypothesis rows in the pool (sum of beam sizes in flight); max_length: longest output."""
        self.model = model
        weight = model.embed.weight
        self.device, self.dtype = weight.device, weight.dtype
        # A beam search's first step runs in add() on CPU, one row per sentence instead of K identical
        # ones; on a GPU, where a step costs the same at any row count, newcomers take K rows at once.
        self.first_step_apart = self.device.type == "cpu"
        self.max_length = min(max_length, model.cfg.max_position_embeddings)
        # Positions are allocated 64 at a time up to max_length; rows are fixed. Where the attention runs in C, a
        # beam that moves takes its parent's lineage, not its keys and values (KVCache).
        with torch.inference_mode():  # as the steps run (new_cache asks too)
            lineage = model.plan.attends(weight, model.cfg.d_model // model.cfg.decoder_attention_heads)
            self.cache = model.new_cache(
                rows, min(64, self.max_length), self.dtype, self.device, limit=self.max_length, zeroed=True,
                lineage=lineage,
            )  # fmt: skip
        self.cache.resize(0, 0)
        # Where the attention runs in C (each row reads its sentence's keys over its own length), a sentence keeps
        # a slot of the source keys while it decodes: one joining writes its own, one leaving frees its slot, and
        # no other sentence's keys move (CrossCache.place). Elsewhere the batch's keys are compacted as they go.
        self.slotted = lineage
        self.cross: CrossCache | None = None
        self.groups: dict[SearchOptions, SearchGroup] = {}
        self.tokens = torch.empty(0, dtype=torch.long, device=self.device)  # (N,) next input of each row
        self.positions = torch.empty(0, dtype=torch.long, device=self.device)  # (N,) its position
        self._finished: list[tuple[Hashable, list[Hypothesis]]] = []  # ended at their first step (add)

    @property
    def rows(self) -> int:
        """Hypothesis rows in use."""
        return self.cache.rows

    @property
    def capacity(self) -> int:
        return self.cache.capacity

    @property
    def sentences(self) -> int:
        return sum(len(g.keys) for g in self.groups.values())

    def keys(self) -> list[Hashable]:
        return [k for g in self.groups.values() for k in g.keys]

    @torch.inference_mode()
    def add(self, keys: list[Hashable], sources: list[list[int]], max_lengths: list[int], opts: SearchOptions) -> None:
        """Encode non-empty sources and give each beam_size rows; raises IndexError past the pool.

        On CPU a beam search's first step runs here, one row per sentence (its K beams are all the
        start token, as when decoding alone), rather than on K identical rows in the next step().
        Sentences that end at that step come back from the next step().
        """
        b, K = len(sources), opts.beam_size
        N = self.rows
        if N + b * K > self.capacity:
            raise IndexError(f"{b * K} rows asked, {self.capacity - N} free")
        if max(max_lengths) > self.max_length:
            raise ValueError(f"max length {max(max_lengths)} is past the batch's {self.max_length}")
        dev = self.device
        src_ids, src_mask = pad_batch(sources, self.model.cfg.pad_token_id, dev)
        cross = self.model.cross_cache(self.model.encode(src_ids, src_mask), src_mask)
        caps = torch.tensor(max_lengths, device=dev)  # (b,)
        group = self.groups.get(opts)
        # Token buffers as wide as the longest running sentence needs (step() widens them), not
        # max_length: every beam step gathers and writes them whole.
        state = BeamState.start(b, K, TOKEN_WIDTH if group is None else group.state.width, dev)
        pos = torch.zeros(b, dtype=torch.long, device=dev)  # (b,)
        tokens = torch.full((b * K,), opts.start_token_id, dtype=torch.long, device=dev)  # (b*K,)
        written = 0  # positions the newcomers' rows hold
        if K > 1 and self.first_step_apart:
            first = self._first_step(keys, cross, caps, state, opts)
            if first is None:
                return
            keep, tokens = first
            keys = [keys[i] for i in keep.tolist()]
            state.select(keep)
            caps, b = caps[keep], keep.numel()
            pos = torch.ones(b, dtype=torch.long, device=dev)
            written = 1
        sentence = self._seat(cross)  # (b,) each newcomer's index in the source keys
        group = self.groups.setdefault(opts, SearchGroup.empty(opts, state.width, dev))
        group.join(keys, torch.arange(N, N + b * K, device=dev).view(b, K), caps, sentence, state, pos)
        self.tokens = torch.cat([self.tokens, tokens])
        self.cache.resize(N + b * K, max(self.cache.length, written))
        self._index_rows()

    def _seat(self, cross: CrossCache) -> torch.Tensor:
        """Newcomers' source keys into the batch's: the free slots, lowest first (slotted), or after the live
        sentences' (the others dropped first: extending copies every kept one). Returns their indices (b,)."""
        b = cross.src_mask.shape[0]
        if self.cross is None:
            self.cross = cross
            return torch.arange(b, device=self.device)
        if not self.slotted:
            self._compact_sentences(force=True)
            B = self.cross.src_mask.shape[0]
            self.cross.extend(cross)
            return torch.arange(B, B + b, device=self.device)
        used = torch.zeros(self.cross.src_mask.shape[0] + b, dtype=torch.bool, device=self.device)
        if self.groups:
            used[alive(self.groups)] = True
        slots = (~used).nonzero()[:b, 0]
        self.cross.place(cross, slots)
        return slots

    def _first_step(
        self, keys: list[Hashable], cross: CrossCache, caps: torch.Tensor, state: BeamState, opts: SearchOptions
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Newcomers' first decoder step, one row each, with a cache of their own; their beams' position 0
        is then written to the K rows each will hold (after the rows in use). Returns the sentences that
        go on, keep (b',), and their next tokens (b' * K,); None when none does. Trims `cross` to them."""
        b, K = caps.numel(), opts.beam_size
        dev = self.device
        first = self.model.new_cache(b, 1, self.dtype, dev)
        start = torch.full((b,), opts.start_token_id, dtype=torch.long, device=dev)
        log_probs = self.model.decode_step(start, 0, first, cross, log_probs=True).repeat_interleave(K, dim=0)
        plan = self.model.plan
        advance = advance_in_c(log_probs, state, caps, opts, plan)
        if advance is not None:  # constrain and beam_step in one C call; (0 + 1) ** length_penalty is 1
            _, token, done, _, _ = advance(log_probs.view(b, K, -1), 0, 1.0)
        else:
            log_probs = constrain(log_probs, 0, caps.repeat_interleave(K), opts)
            _, token, done = beam_step(log_probs.view(b, K, -1), state, torch.zeros_like(caps), caps, opts, plan=plan)
        for i in done.nonzero()[:, 0].tolist():
            self._finished.append((keys[i], finished_hypotheses(state, i, opts)))
        keep = (~done).nonzero()[:, 0]
        if keep.numel() == 0:
            return None
        if keep.numel() < b:
            cross.select(keep)
        # Every beam continues its sentence's one row: position 0 of rows N + i * K + k is that row's.
        k, v = (c[:, keep, :, :1].repeat_interleave(K, dim=1) for c in (first.k, first.v))  # (L, b' * K, H, 1, D)
        self.cache.write(self.rows, k, v)
        return keep, token[keep].reshape(-1)

    @torch.inference_mode()
    def step(self) -> list[tuple[Hashable, list[Hypothesis]]]:
        """One decoder step for every row; returns (key, n-best) of the sentences that finished."""
        finished, self._finished = self._finished, []  # sentences that ended at their first step, in add()
        first_finished = len(finished)
        if not self.rows or self.cross is None:
            return finished
        groups = list(self.groups.values())
        order = torch.cat([g.rows.view(-1) for g in groups])  # rows grouped by search, sentence, beam
        log_probs = self.model.decode_step(self.tokens, self.positions, self.cache, self.cross, order, log_probs=True)
        updates = {}
        start = 0
        for g in groups:
            b, K = g.rows.shape
            lp = log_probs[start : start + b * K]  # (b*K, V)
            start += b * K
            if g.state.width < self.cache.length:  # a beam step writes at its sentences' positions (< length)
                g.state.widen(min(self.max_length, max(self.cache.length, 2 * g.state.width)))
            advance = g.advance(lp, self.model.plan)
            if advance is not None:  # constrain and beam_step in one C call: the same answer
                norm = length_norms(g.pos, lp.dtype, g.opts.length_penalty).view(b)  # as beam_step's
                src_beam, token, done, _, _ = advance(lp.view(b, K, -1), g.pos, norm)
            else:
                lp = constrain(
                    lp, g.pos.repeat_interleave(K), g.max_lengths.repeat_interleave(K), g.opts,
                    g.state.run_tokens.view(b * K, -1),
                )  # fmt: skip
                src_beam, token, done = beam_step(
                    lp.view(b, K, -1), g.state, g.pos, g.max_lengths, g.opts, plan=self.model.plan
                )
            for i in done.nonzero()[:, 0].tolist():
                finished.append((g.keys[i], finished_hypotheses(g.state, i, g.opts)))
            updates[g.opts] = (~done, g.rows.gather(1, src_beam), token)
        if len(finished) == first_finished:
            move = advance_listed if self.rows <= SMALL_REORDER and self.device.type == "cpu" else advance_rows
            self.tokens = move(self.groups, self.cache, self.positions, updates)
            self.positions = self.positions + 1
        else:
            self._regroup(updates, advance=True)
        return finished

    @torch.inference_mode()
    def remove(self, keys: set[Hashable]) -> None:
        """Drop sentences mid-decode (cancelled, deadline passed); their rows are free at once."""
        if not self.groups:
            return
        updates = {}
        for opts, g in self.groups.items():
            keep = torch.tensor([k not in keys for k in g.keys], dtype=torch.bool, device=self.device)
            updates[opts] = (keep, g.rows, self.tokens[g.rows])
        self._regroup(updates, advance=False)

    def _regroup(
        self, updates: dict[SearchOptions, tuple[torch.Tensor, torch.Tensor, torch.Tensor]], *, advance: bool
    ) -> None:
        """Keep each group's sentences where keep (b,) is set, beam k continuing from row src (b, K) with
        token (b, K); compact the surviving rows into [0, M) moving as few as possible."""
        dest, src, tok = [], [], []
        for opts, (keep, src_rows, token) in updates.items():
            g = self.groups[opts]
            idx = keep.nonzero()[:, 0]
            rows = continue_in_place(src_rows[idx], g.rows[idx])  # (b', K) a continuing beam keeps its row
            dest.append(rows.view(-1))
            src.append(src_rows[idx].view(-1))
            tok.append(token[idx].view(-1))
            g.select(idx)
            g.rows = rows
            if advance:
                g.pos = g.pos + 1
        self.groups = {o: g for o, g in self.groups.items() if g.keys}
        old_dest, old_src = torch.cat(dest), torch.cat(src)  # (M,) surviving rows and their cache sources
        M, N = old_dest.numel(), self.rows
        # Rows already below M stay; rows at or above M move into the holes that finished rows left.
        where = fill_holes(old_dest)  # (M,) the new row of each surviving row
        new_index = torch.full((N,), -1, dtype=torch.long, device=self.device)
        new_index[old_dest] = where
        cache_src = torch.empty(M, dtype=torch.long, device=self.device)
        cache_src[where] = old_src
        owned = torch.empty_like(cache_src)
        owned[where] = old_dest
        # a moved row copies only as far as it has written
        self.cache.compact(torch.arange(M, device=self.device), owned, cache_src, self.positions + 1)
        self.tokens = torch.empty(M, dtype=torch.long, device=self.device)
        self.tokens[where] = torch.cat(tok)
        for g in self.groups.values():
            g.rows = new_index[g.rows]
        self._compact_sentences()
        self._index_rows()

    def _compact_sentences(self, *, force: bool = False) -> None:
        """Drop finished sentences' cross-attention keys/values and renumber the rest (compact_sources)."""
        if self.cross is None:
            return
        if not self.groups:
            self.cross = None
            self.cache.resize(0, 0)
            return
        compact_sources(self.cross, self.groups, self.slotted, force)

    def _index_rows(self) -> None:
        """Per row: its position, and its query slot among its sentence's beams for cross-attention."""
        if self.cross is not None:
            self.positions = index_rows(self.groups, self.cross, self.rows)


Updates = dict[SearchOptions, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # per group: keep, source rows, tokens


def advance_rows(
    groups: dict[SearchOptions, SearchGroup], cache: KVCache, positions: torch.Tensor, updates: Updates
) -> torch.Tensor:
    """A step's reorder when no sentence left: beams move only among their sentence's own rows, so rows in use, each
    row's sentence and query slot (row_index) stay as they are; each group's positions advance. Returns every row's
    next token (N,); the caller advances the rows' positions."""
    cache_src = torch.empty(positions.numel(), dtype=torch.long, device=positions.device)  # (N,)
    tokens = torch.empty_like(cache_src)
    for opts, (_, src_rows, token) in updates.items():
        g = groups[opts]
        g.rows = continue_in_place(src_rows, g.rows)  # (b, K) a continuing beam keeps its row
        cache_src[g.rows.view(-1)] = src_rows.view(-1)
        tokens[g.rows.view(-1)] = token.view(-1)
        g.pos = g.pos + 1
    cache.reorder(cache_src, positions + 1)  # a moved row copies only as far as it has written
    return tokens


def advance_listed(
    groups: dict[SearchOptions, SearchGroup], cache: KVCache, positions: torch.Tensor, updates: Updates
) -> torch.Tensor:
    """advance_rows over Python lists, for a few rows on CPU (a dozen tensor ops cost more than the work): the same
    rows, tokens and copies. A row a beam moves into is no beam's parent (continue_in_place gives each parent's
    first child the parent's row), so the copies read rows none of them writes."""
    tokens = [0] * positions.numel()
    moved: list[tuple[int, int]] = []  # (new row, the row it continues) where they differ
    for opts, (_, src_rows, token) in updates.items():
        g = groups[opts]
        parents, owned = src_rows.tolist(), g.rows.tolist()
        placed = [continue_listed(p, r) for p, r in zip(parents, owned, strict=True)]
        flat_rows, flat_parents = [r for rows in placed for r in rows], [p for ps in parents for p in ps]
        for row, parent, tok in zip(flat_rows, flat_parents, token.view(-1).tolist(), strict=True):
            tokens[row] = tok
            if row != parent:
                moved.append((row, parent))
        g.rows = torch.tensor(placed, dtype=torch.long).view(g.rows.shape)
        g.pos = g.pos + 1
    if moved:
        dest, src = (torch.tensor(rows) for rows in zip(*moved, strict=True))
        if cache.lineage is not None:
            cache.lineage.index_copy_(0, dest, cache.lineage[src])
        else:
            cache.copy(dest, src, positions + 1)  # only as far as each row has written
    return torch.tensor(tokens, dtype=torch.long)


def alive(groups: dict[SearchOptions, SearchGroup]) -> torch.Tensor:
    """(b,) the source keys' index of every running sentence (groups not empty)."""
    return torch.cat([g.sentence for g in groups.values()])


def compact_sources(cross: CrossCache, groups: dict[SearchOptions, SearchGroup], slotted: bool, force: bool) -> None:
    """Drop finished sentences' cross-attention keys/values and renumber the rest, where it pays.

    Compacting copies every live sentence's keys/values, and sentences finish at nearly every step, so finished ones
    stay until they are a quarter of the cache or newcomers join (`force`: which copies it anyway): no row queries
    them, and attending over them costs less than the copy. Slotted, nothing is copied as sentences come and go:
    the slots are compacted only once three quarters of them are free, or the live sentences' sources fit in half
    the positions.
    """
    live = alive(groups).sort().values
    B = cross.src_mask.shape[0]
    if slotted:
        mask = cross.src_mask
        longest = int(mask.index_select(0, live).sum(-1).max())
        if 4 * live.numel() > B and 2 * attended_keys(longest, cross.v[0].shape[-1]) > mask.shape[3]:
            return
    elif live.numel() == B or (not force and 4 * (B - live.numel()) < B):
        return
    cross.select(live)
    cross.trim()
    renumber = torch.full((B,), -1, dtype=torch.long, device=live.device)
    renumber[live] = torch.arange(live.numel(), device=live.device)
    for g in groups.values():
        g.sentence = renumber[g.sentence]


def index_rows(groups: dict[SearchOptions, SearchGroup], cross: CrossCache, N: int) -> torch.Tensor:
    """Each of the N rows' query slot among its sentence's beams (cross.row_index, for cross-attention); returns
    each row's position (N,)."""
    device = cross.src_mask.device
    beams = max(g.opts.beam_size for g in groups.values())
    row_index = torch.empty(N, dtype=torch.long, device=device)
    positions = torch.empty(N, dtype=torch.long, device=device)
    for g in groups.values():
        K = g.rows.shape[1]
        flat = g.rows.view(-1)
        row_index[flat] = (g.sentence[:, None] * beams + torch.arange(K, device=device)).view(-1)
        positions[flat] = g.pos.repeat_interleave(K)
    cross.row_index, cross.beams = row_index, beams
    return positions
