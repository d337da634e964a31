"""A decode step's attention in C (csrc/attention.c): each row's query against its cached keys and values, the
step's own key and value written first, and the cache's lineage and row copies a beam reorder makes."""

from __future__ import annotations

import torch

from model.kernels import native

MOST_HEAD_DIM = 256  # csrc/attention.c keeps a head's query and output in 16 vectors


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    length: int | torch.Tensor,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v for each row's one query over its own positions; only where built().

    q: (N, H, D) float32, contiguous. k, v: (R, H, T, D) float32 with equal strides and unit stride over D.
    length: positions every row attends over, or (N,) int64 per row. rows: where position t of row n
    lives, k[rows[n, t], :, t] ((N, T) int64, any strides; (N, 1) expanded over T for one row per query
    row, as a sentence's cross-attention keys); None: row n. Returns (N, H, D). IndexError, with nothing
    read, where a length or a cache row would lie outside k and v (the kernel checks each before it reads).
    """
    lib = native.kernels()
    N, H, D = q.shape
    native.check(0 < D <= MOST_HEAD_DIM, "attend", f"heads of 1 to {MOST_HEAD_DIM} dimensions, not {D}")
    native.check(
        q.dtype == k.dtype == v.dtype == torch.float32 and q.is_contiguous(), "attend", "float32, q contiguous"
    )
    native.check(
        k.dim() == 4 and k.shape == v.shape and k.shape[1] == H and k.shape[3] == D, "attend", "k, v (R, H, T, D)"
    )
    native.check(k.stride() == v.stride() and k.stride(3) == 1, "attend", "k and v with equal strides, unit over D")
    held = None if isinstance(length, int) else length if length.is_contiguous() else length.contiguous()
    native.check(held is None or (held.dtype == torch.int64 and held.numel() >= N), "attend", f"{N} int64 lengths")
    lengths, each = (None, length) if held is None else (held.data_ptr(), 0)  # per row: the kernel finds the longest
    out = torch.empty(N, H, D)
    native.check(rows is None or (rows.dtype == torch.int64 and rows.dim() == 2), "attend", "rows (N, T) int64")
    r, rs, ts, rN, rT = (
        (None, 0, 0, 0, 0) if rows is None else (rows.data_ptr(), rows.stride(0), rows.stride(1), *rows.shape)
    )
    R, T = k.shape[0], k.shape[2]
    failed = lib.beamserve_attend(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), N, H, D, k.stride(0), k.stride(1), k.stride(2), R, T,
        lengths, each, r, rs, ts, rN, rT, D**-0.5, out.data_ptr(),
    )  # fmt: skip
    if failed == -2:
        raise IndexError(
            f"attention: a head of {D}, a length or a cache row outside the cache's {R} rows of {T} positions"
        )
    if failed:
        raise MemoryError("no memory for the attention's scores")
    return out


def self_attend_step(
    qkv: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: int | torch.Tensor, lineage: torch.Tensor | None
) -> torch.Tensor:
    """A decoder step's self-attention on the KVCache (model/nn/kv_cache.py), in one call: row n's key and value
    from qkv (N, 3 * H * D) float32 (its query, key and value, unit stride within a row) written at its position
    of cache row n of k, v (R, H, T, D), then row n's query against its positions up to that one. pos: one position
    for every row, or (N,) int64 per row (rows at their own positions, no lineage). With a lineage (R', T') int64,
    lineage[n, pos] is set to n and row n reads position t from buffer row lineage[n, t]. Returns (N, H, D);
    IndexError, with nothing written, where a position or a lineage row would lie outside the cache. Only where
    built()."""
    lib = native.kernels()
    N, R, H, T, D = qkv.shape[0], k.shape[0], k.shape[1], k.shape[2], k.shape[3]
    if not (
        qkv.dtype == k.dtype == v.dtype == torch.float32 and qkv.dim() == 2 and qkv.shape[1] == 3 * H * D
        and qkv.stride(1) == 1 and k.dim() == 4 and k.shape == v.shape and k.stride() == v.stride()
        and k.stride(3) == 1 and 0 < D <= MOST_HEAD_DIM
    ):  # fmt: skip
        raise ValueError("self_attend_step: qkv (N, 3 H D), k and v (R, H, T, D) alike, float32")
    positions, at = None, 0
    if isinstance(pos, int):
        at = pos
    else:
        held = pos if pos.is_contiguous() else pos.contiguous()
        if held.dtype != torch.int64 or held.numel() != N:
            raise ValueError(f"self_attend_step: {N} int64 positions")
        positions = held.data_ptr()
    lin, lN, lT, rN, rT = None, 0, 0, 0, 0
    if lineage is not None:
        if lineage.dtype != torch.int64 or lineage.dim() != 2:
            raise ValueError("self_attend_step: the lineage must be (R', T') int64")
        lin, (lN, lT), (rN, rT) = lineage.data_ptr(), lineage.stride(), lineage.shape
    out = torch.empty(N, H, D)
    failed = lib.beamserve_self_attend_step(
        qkv.data_ptr(), qkv.stride(0), N, H, D, k.data_ptr(), v.data_ptr(), k.stride(0), k.stride(1), k.stride(2),
        R, T, positions, at, lin, lN, lT, rN, rT, D**-0.5, out.data_ptr(),
    )  # fmt: skip
    if failed == -2:
        raise IndexError(f"self-attention step: a position or a lineage row outside the cache's {R} rows of {T}")
    if failed:
        raise MemoryError("no memory for the attention's scores")
    return out


def follow(lineage: torch.Tensor, rows: torch.Tensor, t: int) -> None:
    """A lineage's reorder in one call (model/nn/kv_cache.py's KVCache.follow): lineage (R, T') int64 with unit
    column stride, row i < rows.numel() taking row rows[i]'s first t entries, rows (n,) int64 naming any rows."""
    native.check(
        lineage.dtype == rows.dtype == torch.int64 and lineage.dim() == 2 and lineage.stride(1) == 1
        and rows.dim() == 1 and rows.is_contiguous() and lineage.is_cpu and rows.is_cpu,
        "follow", "lineage (R, T') int64 with unit column stride, rows (n,) int64 contiguous, on CPU",
    )  # fmt: skip
    R, T = lineage.shape
    failed = native.kernels().beamserve_follow(
        lineage.data_ptr(), R, T, lineage.stride(0), t, rows.data_ptr(), rows.numel()
    )
    if failed == -2:
        raise IndexError(f"follow: a row outside the lineage's {R}, or {t} positions past its {T}")
    if failed:
        raise MemoryError("no memory for the lineage's reorder")


def copy_rows(k: torch.Tensor, v: torch.Tensor, dest: torch.Tensor, src: torch.Tensor, t: int) -> bool:
    """KVCache.copy in one call: k and v (L, R, H, T, D) float32 contiguous on CPU, row dest[i] of each taking
    positions [0, t) of row src[i] (dest, src (n,) int64 contiguous). False, having copied nothing, where a row is
    both written and read (the rows must be gathered first)."""
    native.check(
        k.dtype == v.dtype == torch.float32 and k.dim() == 5 and k.shape == v.shape and k.is_contiguous()
        and v.is_contiguous() and k.is_cpu and v.is_cpu and dest.dtype == src.dtype == torch.int64
        and dest.dim() == 1 and dest.shape == src.shape and dest.is_contiguous() and src.is_contiguous(),
        "copy_rows", "k, v (L, R, H, T, D) float32 contiguous on CPU; dest, src (n,) int64 contiguous",
    )  # fmt: skip
    L, R, H, T, D = k.shape
    sL, sN, sH = k.stride()[:3]
    failed = native.kernels().beamserve_copy_rows(
        k.data_ptr(), v.data_ptr(), L, R, H, T, D, sL, sN, sH, t, dest.data_ptr(), src.data_ptr(), dest.numel()
    )
    if failed == -2:
        raise IndexError(f"copy_rows: a row outside the cache's {R}, or {t} positions past its {T}")
    if failed == -1:
        raise MemoryError("no memory for copy_rows' check")
    return failed == 0
