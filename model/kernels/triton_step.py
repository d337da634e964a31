"""Triton kernels for the GPU decode step over the static decode state (model/decode/slots.py): each one
computes what the step's PyTorch operators compute there, in one launch instead of several.

- `add_layer_norm`: the residual sum and its LayerNorm in one pass over each row (the sublayer's output
  added to its input, then normalised: post-norm's output, pre-norm's next input).
- `slot_self_attention`: one decode step's self-attention over the slot cache: each row's new key and
  value written at its own position and its query attended over positions 0..pos, the cache read once
  (slots._self_attention's index writes, mask and two matmuls).
- `slot_cross_attention`: each row's query attended over its slot's source keys and values where the
  source mask holds (slots._cross_attention's view of the K beams as one slot's queries).
- `constrained_log_softmax`: the step's log-softmax and its logit constraints (search.constrain:
  n-gram bans given as a mask, suppressed ids, each row's minimum length, forced first token and forced
  end) in two passes over each row, where PyTorch makes a pass for each.

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
    Q, KN, VN,  # (N, H, D) each row's query, new key, new value
    K, V,  # (N, H, T, D) the cache, written at each row's position
    POS,  # (N,) int64 each row's position
    OUT,  # (N, H, D)
    H, T, D, t_len, scale,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    n = tl.program_id(0)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    in_d = d < D
    pos = tl.load(POS + n)
    head = (n * H + h) * D
    q = tl.load(Q + head + d, mask=in_d, other=0.0).to(tl.float32)
    k_new = tl.load(KN + head + d, mask=in_d, other=0.0)
    v_new = tl.load(VN + head + d, mask=in_d, other=0.0)
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
        where = cache + t[:, None] * D + d[None, :]
        both = seen[:, None] & in_d[None, :]
        k = tl.load(K + where, mask=both, other=0.0)
        v = tl.load(V + where, mask=both, other=0.0)
        now = (t == pos)[:, None]
        k = tl.where(now, k_new[None, :], k).to(tl.float32)
        v = tl.where(now, v_new[None, :], v).to(tl.float32)
        scores = tl.where(seen, tl.sum(k * q[None, :], axis=1) * scale, float("-inf"))  # (BLOCK_T,)
        # The first block holds position 0, which every row attends: no block after it meets -inf alone.
        best, total, acc = _online_softmax_step(best, total, acc, scores, v)
    tl.store(OUT + head + d, (acc / total).to(OUT.dtype.element_ty), mask=in_d)


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
    T = k_cache.shape[2]
    if k_cache.shape != (N, H, T, D) or v_cache.shape != k_cache.shape or not k_cache.is_contiguous():
        raise ValueError(f"slot_self_attention: caches {tuple(k_cache.shape)} for queries {tuple(q.shape)}")
    if not v_cache.is_contiguous() or pos.shape != (N,) or pos.dtype != torch.int64 or not 0 < t_len <= T:
        raise ValueError("slot_self_attention: contiguous caches, (N,) int64 positions, 0 < t_len <= T")
    q, k_new, v_new = q.contiguous(), k_new.contiguous(), v_new.contiguous()
    out = torch.empty_like(q)
    _slot_self_attention[(N, H)](
        q, k_new, v_new, k_cache, v_cache, pos, out, H, T, D, t_len, D**-0.5,
        BLOCK_T=min(64, triton.next_power_of_2(t_len)), BLOCK_D=triton.next_power_of_2(D),
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
    POS, MAX_LEN, MIN_LEN, FIRST,  # (N,) int64 each: tokens so far, limit, minimum, forced first (-1: none)
    SUPPRESSED,  # (V,) bool: never generated
    BANS,  # (N, V) float32, 0 or -inf: each row's banned tokens (HAS_BANS)
    V, eos, forced_eos,  # forced_eos -1: none
    BLOCK_V: tl.constexpr, HAS_BANS: tl.constexpr,
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
    pos = tl.load(POS + row)
    first = tl.load(FIRST + row)
    too_early = pos < tl.load(MIN_LEN + row)
    starting = (pos == 0) & (first >= 0)
    last = (forced_eos >= 0) & (tl.load(MAX_LEN + row) == pos + 1)
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        inside = cols < V
        y = tl.load(x_row + cols, mask=inside, other=0.0).to(tl.float32) - log_total
        if HAS_BANS:  # before the forced tokens, which override a ban as constrain orders them
            y += tl.load(BANS + row * V + cols, mask=inside, other=0.0)
        y = tl.where(tl.load(SUPPRESSED + cols, mask=inside, other=0) != 0, float("-inf"), y)
        y = tl.where(too_early & (cols == eos), float("-inf"), y)
        # A forced token: every other -inf, its log-probability 0; the forced end last, as constrain orders them.
        y = tl.where(starting, tl.where(cols == first, 0.0, float("-inf")), y)
        y = tl.where(last, tl.where(cols == forced_eos, 0.0, float("-inf")), y)
        tl.store(OUT + row * V + cols, y, mask=inside)


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
) -> torch.Tensor:
    """log_softmax(logits (N, V)) in float32 with search.constrain's constraints, each row by its own (N,) int64
    position, length limit, minimum length and forced first token (-1: none); suppressed (V,) bool; bans (N, V)
    float32, 0 or -inf (the n-gram bans, found by search.ban_repeated_ngrams) or None. -> (N, V) float32."""
    N, V = logits.shape
    rows = (pos, max_len, min_len, first_token)
    if any(t.shape != (N,) or t.dtype != torch.int64 for t in rows) or suppressed.shape != (V,):
        raise ValueError(f"constrained_log_softmax: (N,) int64 per row and a (V,) mask for logits {(N, V)}")
    if suppressed.dtype != torch.bool:
        raise ValueError("constrained_log_softmax: a bool mask of suppressed ids")
    if bans is not None and (bans.shape != (N, V) or bans.dtype != torch.float32):
        raise ValueError(f"constrained_log_softmax: bans (N, V) float32 for logits {(N, V)}")
    logits = logits.contiguous()
    out = torch.empty(N, V, dtype=torch.float32, device=logits.device)
    _constrained_log_softmax[(N,)](
        logits, out, *(t.contiguous() for t in rows), suppressed.contiguous(),
        out if bans is None else bans.contiguous(), V, eos, -1 if forced_eos is None else forced_eos,
        BLOCK_V=min(4096, triton.next_power_of_2(V)), HAS_BANS=bans is not None,
    )  # fmt: skip
    return out


# Every kernel this module launches (one launch each a call of its wrapper), by name: what a count of a step's
# launches wraps (tests/test_step_budget.py).
LAUNCHED = ("_add_layer_norm", "_slot_self_attention", "_slot_cross_attention", "_constrained_log_softmax")
