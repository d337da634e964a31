"""Triton kernels for the GPU decode step over the static decode state (model/decode/slots.py): each one
computes what the step's PyTorch operators compute there, in one launch instead of several.

- `add_layer_norm`: the residual sum and its LayerNorm in one pass over each row (the sublayer's output
  added to its input, then normalised: post-norm's output, pre-norm's next input).
- `lineage_self_attention` (and `slot_self_attention`, its form for per-row tensors): one decode step's
  self-attention from the fused q, k, v projection: each row's new key and value written at its own position of
  its own cache row, its query attended over positions 0..pos, each earlier position read from the cache row
  its lineage names (a beam reorder moves lineage indices, not keys: nothing is copied), the cache read once
  (slots._self_attention's index writes, mask, two matmuls and the reorder's copies).
- `slot_cross_attention`: each row's query attended over its slot's source keys and values where the
  source mask holds (slots._cross_attention's view of the K beams as one slot's queries).
- `constrained_log_softmax`: the step's log-softmax and its logit constraints (search.constrain:
  n-gram bans given as a mask, suppressed ids, each slot's minimum length, forced first token and forced
  end) in two passes over each row, where PyTorch makes a pass for each; and each block of CHUNK tokens'
  greatest log-probability, which the beam step ranks first.
- `ngram_bans`: search.ban_repeated_ngrams as a (N, V) mask kept in the state, each row's last bans lifted
  first, so a row touches as many entries as it has positions, not its vocabulary.
- `embed`: the token embedding times its scale plus the position's sinusoid (Seq2Seq.embed_at).
- `slot_beam_step`: search.beam_step for every active slot (the 2K best candidates by the block maxima then
  those blocks' tokens, the K that run on, the finished set merged, length penalty, early stopping) and the
  step's bookkeeping after it (finished flags, positions, next tokens, the cache lineage), one program a slot.

Each kernel is tested against its PyTorch reference on CPU tensors under Triton's interpreter
(TRITON_INTERPRET=1, tests/test_triton.py); on a GPU the same source compiles. Importing this module needs
triton (a dev dependency; the CPU serving install does not have it).

Shapes: N = S * K hypothesis rows of S slots, C model width, H heads, D head dim, T cache positions,
P source positions, V vocabulary.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_layer_norm(
    X, R, W, B, SUM, Y,  # (N, C) each but W, B (C,)
    C, eps,
    BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < C
    x = tl.load(X + row * C + cols, mask=inside, other=0.0).to(tl.float32)
    x += tl.load(R + row * C + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(SUM + row * C + cols, x.to(SUM.dtype.element_ty), mask=inside)
    mean = tl.sum(x, axis=0) / C
    centred = tl.where(inside, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / C + eps)
    w = tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(Y + row * C + cols, (centred * rstd * w + b).to(Y.dtype.element_ty), mask=inside)


def add_layer_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """x + residual and its LayerNorm, each (N, C) as x: (sum, normed). x and residual contiguous (N, C);
    the sum and the statistics in float32 whatever x's type, as F.layer_norm computes them."""
    if x.shape != residual.shape or x.dim() != 2 or weight.shape != (x.shape[1],) or bias.shape != weight.shape:
        raise ValueError(f"add_layer_norm: x {tuple(x.shape)}, residual {tuple(residual.shape)}, weight and bias (C,)")
    x, residual = x.contiguous(), residual.contiguous()
    N, C = x.shape
    summed, normed = torch.empty_like(x), torch.empty_like(x)
    _add_layer_norm[(N,)](x, residual, weight, bias, summed, normed, C, eps, BLOCK=triton.next_power_of_2(C))
    return summed, normed


@triton.jit
def _online_softmax_step(best, total, acc, scores, v):
    """One block of an online softmax: scores (BLOCK,) with -inf where masked, v (BLOCK, BLOCK_D) float32."""
    new_best = tl.maximum(best, tl.max(scores, axis=0))
    weights = tl.exp(scores - new_best)
    shrink = tl.exp(best - new_best)
    return new_best, total * shrink + tl.sum(weights, axis=0), acc * shrink + tl.sum(weights[:, None] * v, axis=0)


@triton.jit
def _slot_self_attention(
    QKV,  # (N, >= 3 H D) each row's query, new key and new value side by side (a row of `qkv_stride` elements)
    K, V,  # (N, H, T, D) the cache, written at each row's position
    POS,  # (N // beams,) int64 each row's position, read as row // beams (clamped to t_len - 1)
    LIN,  # (N, T) int64 with HAS_LINEAGE: the cache row holding each row's position t < its position
    OUT,  # (N, H, D)
    beams, qkv_stride, H, T, D, t_len, scale,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, HAS_LINEAGE: tl.constexpr,
):  # fmt: skip
    n = tl.program_id(0)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    in_d = d < D
    pos = tl.minimum(tl.load(POS + n // beams), t_len - 1)
    row = QKV + n * qkv_stride + h * D
    q = tl.load(row + d, mask=in_d, other=0.0).to(tl.float32)
    k_new = tl.load(row + H * D + d, mask=in_d, other=0.0)
    v_new = tl.load(row + 2 * H * D + d, mask=in_d, other=0.0)
    cache = (n * H + h) * T * D
    tl.store(K + cache + pos * D + d, k_new, mask=in_d)
    tl.store(V + cache + pos * D + d, v_new, mask=in_d)
    # Online softmax over the positions 0..pos, BLOCK_T at a time; position pos's key and value are the
    # new ones (taken from registers: the store above need not be visible to this program's loads).
    best = tl.full((), float("-inf"), tl.float32)
    total = tl.full((), 0.0, tl.float32)
    acc = tl.zeros((BLOCK_D,), tl.float32)
    for start in range(0, t_len, BLOCK_T):
        t = start + tl.arange(0, BLOCK_T)
        seen = t <= pos
        if HAS_LINEAGE:  # position t of this row's history lies in cache row LIN[n, t]
            held = tl.load(LIN + n * T + t, mask=t < pos, other=0)
            where = ((held * H + h) * T + t)[:, None] * D + d[None, :]
        else:
            where = cache + t[:, None] * D + d[None, :]
        both = (t < pos)[:, None] & in_d[None, :]
        k = tl.load(K + where, mask=both, other=0.0)
        v = tl.load(V + where, mask=both, other=0.0)
        now = (t == pos)[:, None]
        k = tl.where(now, k_new[None, :], k).to(tl.float32)
        v = tl.where(now, v_new[None, :], v).to(tl.float32)
        scores = tl.where(seen, tl.sum(k * q[None, :], axis=1) * scale, float("-inf"))  # (BLOCK_T,)
        # The first block holds position 0, which every row attends: no block after it meets -inf alone.
        best, total, acc = _online_softmax_step(best, total, acc, scores, v)
    tl.store(OUT + (n * H + h) * D + d, (acc / total).to(OUT.dtype.element_ty), mask=in_d)


def slot_self_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pos: torch.Tensor,
    t_len: int,
) -> torch.Tensor:
    """Each row n's new key and value (N, H, D) written into the cache (N, H, T, D) at position pos[n], and its
    query (N, H, D) attended over its positions 0..pos[n] (every pos[n] < t_len <= T): softmax(q k^T / sqrt(D))
    v -> (N, H, D). The caches contiguous and updated in place."""
    N, H, D = q.shape
    if k_new.shape != q.shape or v_new.shape != q.shape or pos.shape != (N,):
        raise ValueError(f"slot_self_attention: (N, H, D) queries, keys and values and (N,) positions, {(N, H, D)}")
    qkv = torch.stack([q, k_new, v_new], dim=1).view(N, 3 * H * D)  # (N, 3 H D) as a fused projection gives them
    return lineage_self_attention(qkv, k_cache, v_cache, pos, None, t_len, 1)


def lineage_self_attention(
    qkv: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pos: torch.Tensor,
    lineage: torch.Tensor | None,
    t_len: int,
    beams: int,
) -> torch.Tensor:
    """The step's self-attention from the fused projection's rows qkv (N, 3 H D, rows of any stride): row n's key
    and value written into its own cache row (N, H, T, D) at position p = min(pos[n // beams], t_len - 1), its
    query attended over positions 0..p, each earlier position t read from cache row lineage[n, t] (N, T)
    (None: row n's own) -> (N, H, D). The caches contiguous and updated in place."""
    N, H, T, D = k_cache.shape
    if qkv.shape[0] != N or qkv.shape[1] < 3 * H * D or qkv.stride(1) != 1:
        raise ValueError(f"self attention: (N, 3 H D) rows of unit stride for caches {tuple(k_cache.shape)}")
    if v_cache.shape != k_cache.shape or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("self attention: two contiguous caches of one shape")
    if pos.dtype != torch.int64 or pos.shape != (N // beams,) or N % beams or not 0 < t_len <= T:
        raise ValueError("self attention: (N // beams,) int64 positions, 0 < t_len <= T")
    if lineage is not None and (lineage.shape != (N, T) or lineage.dtype != torch.int64 or not lineage.is_contiguous()):
        raise ValueError(f"self attention: a contiguous (N, T) int64 lineage, {(N, T)}")
    out = torch.empty(N, H, D, dtype=qkv.dtype, device=qkv.device)
    _slot_self_attention[(N, H)](
        qkv, k_cache, v_cache, pos.contiguous(), pos if lineage is None else lineage, out,
        beams, qkv.stride(0), H, T, D, t_len, D**-0.5,
        BLOCK_T=min(64, triton.next_power_of_2(t_len)), BLOCK_D=triton.next_power_of_2(D),
        HAS_LINEAGE=lineage is not None,
    )  # fmt: skip
    return out


@triton.jit
def _slot_cross_attention(
    Q,  # (N, H, D)
    K, V,  # (S, H, P, D) each slot's source keys and values
    MASK,  # (S, P) bool, True on real source tokens
    OUT,  # (N, H, D)
    beams, H, P, D, p_len, scale,
    BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    n = tl.program_id(0)
    h = tl.program_id(1)
    slot = n // beams
    d = tl.arange(0, BLOCK_D)
    in_d = d < D
    head = (n * H + h) * D
    q = tl.load(Q + head + d, mask=in_d, other=0.0).to(tl.float32)
    source = (slot * H + h) * P * D
    best = tl.full((), float("-inf"), tl.float32)
    total = tl.full((), 0.0, tl.float32)
    acc = tl.zeros((BLOCK_D,), tl.float32)
    for start in range(0, p_len, BLOCK_P):
        p = start + tl.arange(0, BLOCK_P)
        seen = (p < p_len) & (tl.load(MASK + slot * P + p, mask=p < p_len, other=0) != 0)
        where = source + p[:, None] * D + d[None, :]
        both = seen[:, None] & in_d[None, :]
        k = tl.load(K + where, mask=both, other=0.0).to(tl.float32)
        v = tl.load(V + where, mask=both, other=0.0).to(tl.float32)
        scores = tl.where(seen, tl.sum(k * q[None, :], axis=1) * scale, float("-inf"))  # (BLOCK_P,)
        # A block with nothing to attend leaves the sums as they were (exp(-inf - -inf) would be NaN).
        if tl.max(seen.to(tl.int32), axis=0) > 0:
            best, total, acc = _online_softmax_step(best, total, acc, scores, v)
    tl.store(OUT + head + d, (acc / total).to(OUT.dtype.element_ty), mask=in_d)


def slot_cross_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, src_mask: torch.Tensor, p_len: int
) -> torch.Tensor:
    """Each row n's query (N, H, D) attended over slot n // K's source keys and values (S, H, P, D) at the
    positions below p_len where src_mask (S, P) holds (every slot has one): softmax(q k^T / sqrt(D)) v ->
    (N, H, D), N = S * K."""
    N, H, D = q.shape
    S, P = src_mask.shape
    if k.shape != (S, H, P, D) or v.shape != k.shape or N % S or not 0 < p_len <= P:
        raise ValueError(f"slot_cross_attention: sources {tuple(k.shape)}, mask {(S, P)}, queries {tuple(q.shape)}")
    if src_mask.dtype != torch.bool:
        raise ValueError("slot_cross_attention: a bool source mask")
    q, k, v, src_mask = q.contiguous(), k.contiguous(), v.contiguous(), src_mask.contiguous()
    out = torch.empty_like(q)
    _slot_cross_attention[(N, H)](
        q, k, v, src_mask, out, N // S, H, P, D, p_len, D**-0.5,
        BLOCK_P=min(64, triton.next_power_of_2(p_len)), BLOCK_D=triton.next_power_of_2(D),
    )  # fmt: skip
    return out


@triton.jit
def _constrained_log_softmax(
    X,  # (N, V) the step's logits
    OUT,  # (N, V) float32 log-probabilities, constrained
    POS, MAX_LEN, MIN_LEN, FIRST,  # (N // beams,) int64 each, read as row // beams: tokens so far, limit, minimum,
    # forced first (-1: none)
    SUPPRESSED,  # (V,) bool: never generated
    BANS,  # (N, V) bool (as int8): each row's banned tokens (HAS_BANS)
    BMAX,  # (N, ceil(V / CHUNK)) float32: each block of CHUNK tokens' greatest log-probability (HAS_BMAX)
    beams, V, eos, forced_eos,  # forced_eos -1: none
    BLOCK_V: tl.constexpr, HAS_BANS: tl.constexpr, HAS_BMAX: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    x_row = X + row * V
    best = tl.full((), float("-inf"), tl.float32)
    total = tl.full((), 0.0, tl.float32)
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x = tl.load(x_row + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        new_best = tl.maximum(best, tl.max(x, axis=0))
        total = total * tl.exp(best - new_best) + tl.sum(tl.exp(x - new_best), axis=0)
        best = new_best
    log_total = best + tl.log(total)
    slot = row // beams
    pos = tl.load(POS + slot)
    first = tl.load(FIRST + slot)
    too_early = pos < tl.load(MIN_LEN + slot)
    starting = (pos == 0) & (first >= 0)
    last = (forced_eos >= 0) & (tl.load(MAX_LEN + slot) == pos + 1)
    blocks = (V + CHUNK - 1) // CHUNK
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        inside = cols < V
        y = tl.load(x_row + cols, mask=inside, other=0.0).to(tl.float32) - log_total
        if HAS_BANS:  # before the forced tokens, which override a ban as constrain orders them
            y = tl.where(tl.load(BANS + row * V + cols, mask=inside, other=0) != 0, float("-inf"), y)
        y = tl.where(tl.load(SUPPRESSED + cols, mask=inside, other=0) != 0, float("-inf"), y)
        y = tl.where(too_early & (cols == eos), float("-inf"), y)
        # A forced token: every other -inf, its log-probability 0; the forced end last, as constrain orders them.
        y = tl.where(starting, tl.where(cols == first, 0.0, float("-inf")), y)
        y = tl.where(last, tl.where(cols == forced_eos, 0.0, float("-inf")), y)
        tl.store(OUT + row * V + cols, y, mask=inside)
        if HAS_BMAX:  # what the beam step ranks candidates by first (slot_beam_step)
            chunked = tl.reshape(tl.where(inside, y, float("-inf")), (BLOCK_V // CHUNK, CHUNK))
            block = start // CHUNK + tl.arange(0, BLOCK_V // CHUNK)
            tl.store(BMAX + row * blocks + block, tl.max(chunked, axis=1), mask=block < blocks)


def constrained_log_softmax(
    logits: torch.Tensor,
    pos: torch.Tensor,
    max_len: torch.Tensor,
    min_len: torch.Tensor,
    first_token: torch.Tensor,
    suppressed: torch.Tensor,
    eos: int,
    forced_eos: int | None,
    bans: torch.Tensor | None = None,
    *,
    beams: int = 1,
    block_maxima: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log_softmax(logits (N, V)) in float32 with search.constrain's constraints, each row n by its slot's (N //
    beams,) int64 position, length limit, minimum length and forced first token (-1: none), read at n // beams
    (beams 1: a row's own); suppressed (V,) bool; bans (N, V) bool (the n-gram bans: ngram_bans, or
    search.ban_repeated_ngrams's) or None. -> the log-probabilities (N, V) float32, and with `block_maxima` each
    block of CHUNK tokens' greatest (N, ceil(V / CHUNK)) float32 (else None)."""
    N, V = logits.shape
    rows = (pos, max_len, min_len, first_token)
    if N % beams or any(t.shape != (N // beams,) or t.dtype != torch.int64 for t in rows) or suppressed.shape != (V,):
        raise ValueError(f"constrained_log_softmax: (N // beams,) int64 options and a (V,) mask for logits {(N, V)}")
    if suppressed.dtype != torch.bool:
        raise ValueError("constrained_log_softmax: a bool mask of suppressed ids")
    if bans is not None and (bans.shape != (N, V) or bans.dtype != torch.bool):
        raise ValueError(f"constrained_log_softmax: bans (N, V) bool for logits {(N, V)}")
    logits = logits.contiguous()
    out = torch.empty(N, V, dtype=torch.float32, device=logits.device)
    maxima = torch.empty(N, -(-V // CHUNK), dtype=torch.float32, device=logits.device) if block_maxima else None
    _constrained_log_softmax[(N,)](
        logits, out, *(t.contiguous() for t in rows), suppressed.contiguous(),
        suppressed if bans is None else bans.contiguous().view(torch.int8), out if maxima is None else maxima,
        beams, V, eos, -1 if forced_eos is None else forced_eos,
        BLOCK_V=max(CHUNK, min(4096, triton.next_power_of_2(V))), HAS_BANS=bans is not None,
        HAS_BMAX=maxima is not None, CHUNK=CHUNK,
    )  # fmt: skip
    return out, maxima


CHUNK = 32  # the tokens of a block whose greatest log-probability the beam step ranks first


@triton.jit
def _ngram_bans(
    HISTORY,  # (N, T) int64 each row's generated tokens, -1 past them
    POS, NGRAM,  # (N // beams,) int64 each: tokens generated, n-gram size (0: none), read as row // beams
    BANS,  # (N, V) bool (as int8): each row's banned tokens, rewritten
    BANNED,  # (N, T) int64 the tokens this row banned at its last call (-1: none), rewritten
    beams, T, V,
    N_MAX: tl.constexpr, BLOCK_T: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    t = tl.arange(0, BLOCK_T)
    in_t = t < T
    old = tl.load(BANNED + row * T + t, mask=in_t, other=-1)
    tl.store(BANS + row * V + old, 0, mask=in_t & (old >= 0))  # the last call's bans lifted
    pos = tl.load(POS + row // beams)
    n = tl.load(NGRAM + row // beams)
    history = HISTORY + row * T
    # An earlier n-gram whose first n - 1 tokens are the row's last n - 1 bans its last token.
    match = in_t & (t <= pos - n) & (t * 0 + n > 0)  # (BLOCK_T,): the slot's size broadcast to the lanes
    for w in tl.static_range(N_MAX - 1):
        tail = tl.load(history + tl.minimum(tl.maximum(pos - (n - 1) + w, 0), T - 1))
        here = tl.load(history + t + w, mask=t + w < T, other=-2)
        match = match & ((here == tail) | (t * 0 + w >= n - 1))
    banned = tl.load(history + t + tl.maximum(n - 1, 0), mask=match, other=-1)
    banned = tl.where(match, banned, -1)
    tl.debug_barrier()
    tl.store(BANS + row * V + banned, 1, mask=match)
    tl.store(BANNED + row * T + t, banned, mask=in_t)


def ngram_bans(
    history: torch.Tensor, pos: torch.Tensor, ngram: torch.Tensor, bans: torch.Tensor, banned: torch.Tensor, n_max: int
) -> torch.Tensor:
    """search.ban_repeated_ngrams as a mask: bans (N, V) bool set, in place, where a token would complete an n-gram
    its row generated (history (N, T), each slot's (N // beams,) int64 position and n-gram size, at most n_max),
    the last call's bans (banned (N, T), which it rewrites) lifted first: each row touches T entries, not V."""
    N, T = history.shape
    V = bans.shape[1]
    if bans.shape != (N, V) or banned.shape != (N, T) or bans.dtype != torch.bool or banned.dtype != torch.int64:
        raise ValueError(f"ngram_bans: (N, V) bool bans and (N, T) int64 banned for a history {(N, T)}")
    if pos.shape != ngram.shape or N % pos.shape[0] or not all(t.is_contiguous() for t in (history, bans, banned)):
        raise ValueError("ngram_bans: contiguous tensors, one position and n-gram size a slot")
    _ngram_bans[(N,)](
        history, pos, ngram, bans.view(torch.int8), banned, N // pos.shape[0], T, V,
        N_MAX=max(n_max, 2), BLOCK_T=triton.next_power_of_2(T),
    )  # fmt: skip
    return bans


@triton.jit
def _embed(
    TOKENS,  # (N,) int64 each row's token
    POS,  # (N // beams,) int64 each row's position, read as row // beams (clamped to t_last)
    E,  # (vocabulary, C) the token embedding
    TABLE,  # (positions, C) the sinusoids
    OUT,  # (N, C)
    beams, C, t_last, scale,
    BLOCK: tl.constexpr,
):  # fmt: skip
    n = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < C
    token = tl.load(TOKENS + n)
    pos = tl.minimum(tl.load(POS + n // beams), t_last)
    e = tl.load(E + token * C + cols, mask=inside, other=0.0)
    scaled = (e.to(tl.float32) * scale).to(OUT.dtype.element_ty)  # as embed(ids) * scale rounds in the model's type
    at = tl.load(TABLE + pos * C + cols, mask=inside, other=0.0)
    tl.store(OUT + n * C + cols, (scaled.to(tl.float32) + at.to(tl.float32)).to(OUT.dtype.element_ty), mask=inside)


def embed(
    tokens: torch.Tensor, pos: torch.Tensor, weight: torch.Tensor, table: torch.Tensor, scale: float, t_last: int
) -> torch.Tensor:
    """Each row's token embedding times `scale` plus its position's sinusoid: tokens (N,) int64, pos (S,) int64
    read as row // (N // S) and clamped to t_last, weight (vocabulary, C), table (positions, C) -> (N, C) in
    weight's type (Seq2Seq.embed_at's sum, rounded as it rounds)."""
    (N,), (S,) = tokens.shape, pos.shape
    C = weight.shape[1]
    if N % S or tokens.dtype != torch.int64 or pos.dtype != torch.int64 or table.shape[1] != C:
        raise ValueError(f"embed: (N,) and (S,) int64, S dividing N, and tables of width {C}")
    if not (weight.is_contiguous() and table.is_contiguous()) or table.dtype != weight.dtype:
        raise ValueError("embed: contiguous tables of one type")
    out = torch.empty(N, C, dtype=weight.dtype, device=weight.device)
    _embed[(N,)](tokens, pos, weight, table, out, N // S, C, t_last, scale, BLOCK=triton.next_power_of_2(C))
    return out


@triton.jit
def _pick(values, order, eligible, prev_value, prev_order, none):
    """The best of `values` after (prev_value, prev_order) in the ranking by value, higher first, then by
    `order`, lower first: its value and order (`none` where nothing is left)."""
    after = eligible & ((values < prev_value) | ((values == prev_value) & (order > prev_order)))
    best = tl.max(tl.where(after, values, float("-inf")), axis=0)
    at = tl.min(tl.where(after & (values == best), order, none), axis=0)
    return best, at


@triton.jit
def _best_blocks(BMAX, RUN_SCORES, s, NB, K: tl.constexpr, K2P: tl.constexpr, BLOCK_F: tl.constexpr):
    """Slot s's 2K best blocks of CHUNK tokens by their greatest log-probability plus their beam's running score,
    best first, equal ones by beam then block: each as beam * NB + block (K2P,), 1 << 62 past the 2K."""
    none = 1 << 62
    j2 = tl.arange(0, K2P)
    F = K * NB
    blocks = tl.full((K2P,), none, tl.int64)
    prev_value = tl.full((), float("inf"), tl.float32)
    prev_order = tl.full((), -1, tl.int64)
    for j in tl.static_range(2 * K):
        best = tl.full((), float("-inf"), tl.float32)
        best_at = tl.full((), none, tl.int64)
        for start in range(0, F, BLOCK_F):
            f = start + tl.arange(0, BLOCK_F)
            inside = f < F
            value = tl.load(BMAX + s * F + f, mask=inside, other=float("-inf"))
            value += tl.load(RUN_SCORES + s * K + f // NB, mask=inside, other=0.0)
            found, found_at = _pick(value, f.to(tl.int64), inside, prev_value, prev_order, none)
            better = (found > best) | ((found == best) & (found_at < best_at))
            best = tl.where(better, found, best)
            best_at = tl.where(better, found_at, best_at)
        blocks = tl.where(j2 == j, best_at, blocks)
        prev_value, prev_order = best, best_at
    return blocks


@triton.jit
def _best_candidates(LP, RUN_SCORES, blocks, s, V, NB, K: tl.constexpr, K2P: tl.constexpr, CHUNK: tl.constexpr):
    """Slot s's 2K best candidates run_scores[k] + LP[k, v] among the tokens of `blocks` (a candidate among the 2K
    lies in one of the 2K best blocks): their scores and orders k * V + v (K2P,), best first, equal by order."""
    none = 1 << 62
    j2 = tl.arange(0, K2P)
    F = K * NB
    beam_of = blocks // NB
    c = tl.arange(0, CHUNK)
    token = (blocks % NB)[:, None] * CHUNK + c[None, :]  # (K2P, CHUNK)
    valid = (blocks < F)[:, None] & (token < V)
    score = tl.load(LP + (s * K + beam_of)[:, None] * V + token, mask=valid, other=float("-inf"))
    score += tl.load(RUN_SCORES + s * K + beam_of, mask=blocks < F, other=0.0)[:, None]
    order = tl.where(valid, beam_of[:, None] * V + token, none)
    flat_score = tl.reshape(score, (K2P * CHUNK,))
    flat_order = tl.reshape(order, (K2P * CHUNK,))
    flat_valid = tl.reshape(valid, (K2P * CHUNK,))
    top_score = tl.full((K2P,), float("-inf"), tl.float32)
    top_order = tl.full((K2P,), 0, tl.int64)
    prev_value = tl.full((), float("inf"), tl.float32)
    prev_order = tl.full((), -1, tl.int64)
    for j in tl.static_range(2 * K):
        best, best_at = _pick(flat_score, flat_order, flat_valid, prev_value, prev_order, none)
        top_score = tl.where(j2 == j, best, top_score)
        top_order = tl.where(j2 == j, best_at, top_order)
        prev_value, prev_order = best, best_at
    return top_score, top_order


@triton.jit
def _merged_parts(
    merged_from, fin_flags, qualifies, top_beam, top_token, K: tl.constexpr, KP: tl.constexpr, K2P: tl.constexpr
):
    """What each merged finished hypothesis (KP,) is: its flag (a finished one's, or whether the candidate
    qualified) and, for a candidate, its source beam and token."""
    k1 = tl.arange(0, KP)
    j2 = tl.arange(0, K2P)
    from_old = merged_from < K
    candidate = tl.where(from_old, 0, merged_from - K)  # (KP,)
    flags = tl.where(
        from_old,
        tl.sum(tl.where(k1[None, :] == merged_from[:, None], fin_flags[None, :].to(tl.int32), 0), axis=1),
        tl.sum(tl.where(j2[None, :] == candidate[:, None], qualifies[None, :].to(tl.int32), 0), axis=1),
    )
    beam = tl.sum(tl.where(j2[None, :] == candidate[:, None], top_beam[None, :], 0), axis=1)
    token = tl.sum(tl.where(j2[None, :] == candidate[:, None], top_token[None, :], 0), axis=1)
    return flags != 0, beam, token


@triton.jit
def _running(running, top_beam, top_token, K: tl.constexpr, KP: tl.constexpr, K2P: tl.constexpr):
    """The K best of the 2K candidates' running scores (those that ended at -1e9 below): their scores, source
    beams and tokens (KP,), best first, equal ones by rank."""
    none = 1 << 62
    k1 = tl.arange(0, KP)
    j2 = tl.arange(0, K2P)
    keep_score = tl.full((KP,), float("-inf"), tl.float32)
    src_beam = tl.zeros((KP,), tl.int64)
    new_token = tl.zeros((KP,), tl.int64)
    prev_value = tl.full((), float("inf"), tl.float32)
    prev_order = tl.full((), -1, tl.int64)
    for j in tl.static_range(K):
        best, best_at = _pick(running, j2.to(tl.int64), j2 < 2 * K, prev_value, prev_order, none)
        keep_score = tl.where(k1 == j, best, keep_score)
        src_beam = tl.where(k1 == j, tl.sum(tl.where(j2 == best_at, top_beam, 0), axis=0), src_beam)
        new_token = tl.where(k1 == j, tl.sum(tl.where(j2 == best_at, top_token, 0), axis=0), new_token)
        prev_value, prev_order = best, best_at
    return keep_score, src_beam, new_token


@triton.jit
def _merged(fin_scores, entering, K: tl.constexpr, KP: tl.constexpr, K2P: tl.constexpr):
    """The K best of a slot's K finished scores and its 2K candidates' (fin_scores (KP,), entering (K2P,)), best
    first, a finished one before a candidate of its score: their scores, and where each is from (< K: finished
    hypothesis i; K + j: candidate j)."""
    none = 1 << 62
    k1 = tl.arange(0, KP)
    in_k = k1 < K
    j2 = tl.arange(0, K2P)
    in_2k = j2 < 2 * K
    merged_score = tl.full((KP,), float("-inf"), tl.float32)
    merged_from = tl.zeros((KP,), tl.int64)  # < K: finished hypothesis i; K + j: candidate j
    prev_value = tl.full((), float("inf"), tl.float32)
    prev_order = tl.full((), -1, tl.int64)
    for j in tl.static_range(K):
        kept, kept_at = _pick(fin_scores, k1.to(tl.int64), in_k, prev_value, prev_order, none)
        new, new_at = _pick(entering, K + j2.to(tl.int64), in_2k, prev_value, prev_order, none)
        old = kept >= new  # a finished one before a candidate of the same score (it comes first in the order)
        best = tl.where(old, kept, new)
        best_at = tl.where(old, kept_at, new_at)
        merged_score = tl.where(k1 == j, best, merged_score)
        merged_from = tl.where(k1 == j, best_at, merged_from)
        prev_value, prev_order = best, best_at
    return merged_score, merged_from


@triton.jit
def _slot_beam_step(
    LP,  # (N, V) float32 constrained log-probabilities
    BMAX,  # (N, NB) float32 each block of CHUNK tokens' greatest
    RUN_SCORES, RUN_TOKENS, FIN_SCORES, FIN_TOKENS, FIN_FLAGS, IMPROVABLE,  # search.BeamState: (S, K), (S, K, T)..
    POS, MAX_LEN, NORM, EARLY, ACTIVE, FINISHED,  # (S,): int64, int64, float32, bool, bool, bool
    TOKENS,  # (N,) int64 each row's next input
    LIN,  # (N, T) int64 the cache row holding each row's position t
    V, NB, T, t_len, eos, neg,
    K: tl.constexpr, KP: tl.constexpr, K2P: tl.constexpr, CHUNK: tl.constexpr, BLOCK_F: tl.constexpr,
    BLOCK_T: tl.constexpr,
):  # fmt: skip
    s = tl.program_id(0)
    if tl.load(ACTIVE + s) == 0:
        tl.store(FINISHED + s, 0)
        return
    pos = tl.load(POS + s)
    at = tl.minimum(pos, T - 1)  # where the new token goes in a history (search._extend)
    length_limit = tl.load(MAX_LEN + s) <= pos + 1
    norm = tl.load(NORM + s)
    early = tl.load(EARLY + s) != 0
    improvable = tl.load(IMPROVABLE + s) != 0
    k1 = tl.arange(0, KP)
    in_k = k1 < K
    j2 = tl.arange(0, K2P)
    # The 2K best candidates of run_scores[k] + LP[k, v] (best first, equal ones by beam then token): first the 2K
    # best blocks by their greatest (a candidate among the 2K lies in one), then those blocks' tokens.
    blocks = _best_blocks(BMAX, RUN_SCORES, s, NB, K, K2P, BLOCK_F)
    top_score, top_order = _best_candidates(LP, RUN_SCORES, blocks, s, V, NB, K, K2P, CHUNK)
    top_beam = top_order // V
    top_token = top_order % V
    # search.beam_step from here, for this slot: the K best that did not end keep running.
    hits = (top_token == eos) | length_limit
    keep_score, src_beam, new_token = _running(top_score + hits.to(tl.float32) * neg, top_beam, top_token, K, KP, K2P)
    # The ended among the top K may enter the finished set: the K best of the K finished and the 2K candidates.
    fin_scores = tl.load(FIN_SCORES + s * K + k1, mask=in_k, other=float("-inf"))
    fin_flags = tl.load(FIN_FLAGS + s * K + k1, mask=in_k, other=1) != 0
    all_finished = tl.min(fin_flags.to(tl.int32), axis=0) != 0
    qualifies = hits & (j2 < K) & improvable & ~(all_finished & early)
    entering = top_score / norm + (~qualifies).to(tl.float32) * neg
    merged_score, merged_from = _merged(fin_scores, entering, K, KP, K2P)
    from_old = merged_from < K
    merged_flags, candidate_beam, candidate_token = _merged_parts(
        merged_from, fin_flags, qualifies, top_beam, top_token, K, KP, K2P
    )
    # Every history this step reads, before any is written.
    t = tl.arange(0, BLOCK_T)
    in_t = t < T
    rows_t = in_k[:, None] & in_t[None, :]
    old_rows = tl.where(from_old, merged_from, 0)
    fin_old = tl.load(FIN_TOKENS + (s * K + old_rows)[:, None] * T + t[None, :], mask=rows_t & from_old[:, None])
    fin_new = tl.load(RUN_TOKENS + (s * K + candidate_beam)[:, None] * T + t[None, :], mask=rows_t & ~from_old[:, None])
    fin_new = tl.where(t[None, :] == at, candidate_token[:, None], fin_new)
    fin_tokens = tl.where(from_old[:, None], fin_old, fin_new)
    run_tokens = tl.load(RUN_TOKENS + (s * K + src_beam)[:, None] * T + t[None, :], mask=rows_t)
    run_tokens = tl.where(t[None, :] == at, new_token[:, None], run_tokens)
    finished_now = tl.min(tl.where(in_k, merged_flags.to(tl.int32), 1), axis=0) != 0
    least = tl.min(tl.where(in_k, merged_score, float("inf")), axis=0)
    best_possible = tl.max(tl.where(k1 == 0, keep_score, float("-inf")), axis=0) / norm
    still = improvable & (~finished_now | (best_possible > least))
    done = ~still | length_limit | (finished_now & early)
    # Each row continues its source beam's cache row (the slot's own rows where it is done): its lineage.
    rows = s * K + k1
    source_row = s * K + tl.where(done, k1, src_beam)
    step_at = tl.minimum(pos, t_len - 1)  # the position this step wrote, at each row's own cache row
    lin = tl.load(LIN + source_row[:, None] * T + t[None, :], mask=rows_t & (t[None, :] < step_at))
    lin = tl.where(t[None, :] == step_at, source_row[:, None], lin)
    tl.debug_barrier()
    tl.store(RUN_SCORES + s * K + k1, keep_score, mask=in_k)
    tl.store(RUN_TOKENS + rows[:, None] * T + t[None, :], run_tokens, mask=rows_t)
    tl.store(FIN_SCORES + s * K + k1, merged_score, mask=in_k)
    tl.store(FIN_TOKENS + rows[:, None] * T + t[None, :], fin_tokens, mask=rows_t)
    tl.store(FIN_FLAGS + s * K + k1, merged_flags.to(tl.int8), mask=in_k)
    tl.store(IMPROVABLE + s, still.to(tl.int8))
    tl.store(FINISHED + s, done.to(tl.int8))
    tl.store(POS + s, pos + 1)
    tl.store(ACTIVE + s, (~done).to(tl.int8))
    going = tl.full((KP,), 0, tl.int32) + (~done).to(tl.int32)  # the slot goes on: its rows take their tokens
    tl.store(TOKENS + rows, new_token, mask=in_k & (going != 0))
    tl.store(LIN + rows[:, None] * T + t[None, :], lin, mask=rows_t & (t[None, :] <= step_at))


def slot_beam_step(
    log_probs: torch.Tensor,
    block_maxima: torch.Tensor,
    fields: tuple[torch.Tensor, ...],
    pos: torch.Tensor,
    max_len: torch.Tensor,
    norm: torch.Tensor,
    early_stopping: torch.Tensor,
    active: torch.Tensor,
    finished: torch.Tensor,
    tokens: torch.Tensor,
    lineage: torch.Tensor,
    t_len: int,
    eos: int,
    neg: float,
) -> None:
    """The static state's beam step and its bookkeeping, in place, one program a slot: search.beam_step for each
    active slot (log_probs (N, V) float32 with constrained_log_softmax's block maxima; `fields` the slots' beam
    state in search.BeamState.FIELDS' order; norm (S,) each slot's length norm), then what slots.decode_step does
    after it: finished = active & done, pos + 1, active & ~done, each continuing row's next token, and each row's
    cache lineage (N, T) following its source beam (lineage[n, t]: the cache row holding position t of row n)."""
    run_scores, run_tokens, fin_scores, fin_tokens, fin_flags, improvable = fields
    S, K = run_scores.shape
    N, V = log_probs.shape
    T = run_tokens.shape[2]
    NB = -(-V // CHUNK)
    if N != S * K or block_maxima.shape != (N, NB) or lineage.shape != (N, T) or tokens.shape != (N,):
        raise ValueError(f"slot_beam_step: (N, V) log-probs of {S} slots of {K} beams, (N, {NB}) maxima, (N, T)")
    if not all(t.is_contiguous() for t in (*fields, log_probs, block_maxima, lineage, tokens, pos, active)):
        raise ValueError("slot_beam_step: contiguous tensors, updated in place")
    bools = (fin_flags, improvable, early_stopping, active, finished)
    flags, kept, early, live, ended = (b.view(torch.int8) for b in bools)
    _slot_beam_step[(S,)](
        log_probs, block_maxima, run_scores, run_tokens, fin_scores, fin_tokens, flags, kept,
        pos, max_len, norm, early, live, ended, tokens, lineage,
        V, NB, T, t_len, eos, neg,
        K=K, KP=triton.next_power_of_2(K), K2P=triton.next_power_of_2(2 * K), CHUNK=CHUNK,
        BLOCK_F=min(1024, triton.next_power_of_2(K * NB)), BLOCK_T=triton.next_power_of_2(T),
    )  # fmt: skip


# Every kernel this module launches (one launch each a call of its wrapper), by name: what a count of a step's
# launches wraps (tests/test_step_budget.py).
LAUNCHED = (
    "_add_layer_norm", "_slot_self_attention", "_slot_cross_attention", "_constrained_log_softmax", "_embed",
    "_slot_beam_step", "_ngram_bans",
)  # fmt: skip
