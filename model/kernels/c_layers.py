"""Sublayers, layers and steps in one call (csrc/sublayers.c): the structs of a layer's weights and caches built
once (LinearC, KV, LayerC), the encoder's and decoder's segments and layers, the embedding, and the sublayers
with their checks."""

from __future__ import annotations

import ctypes

import torch

from model.kernels import c_attention, c_gemm, native


class LinearC(ctypes.Structure):
    """csrc/beamserve.h's beamserve_linear_c: a linear layer packed for one of the library's GEMMs (kind 0: int8
    with VNNI; 1: float32), its bias."""

    _fields_ = [
        ("packed", ctypes.c_void_p),
        ("comp", ctypes.c_void_p),
        ("scale", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("N", ctypes.c_int64),
        ("K", ctypes.c_int64),
        ("kind", ctypes.c_int64),
    ]


def c_linear(
    w: c_gemm.VnniWeight | c_gemm.F32Weight, bias: torch.Tensor | None
) -> tuple[LinearC, tuple[torch.Tensor, ...]]:
    """The struct a sublayer call reads for weight w and its bias, and the tensors it points into (to be held
    as long as the struct is)."""
    if bias is not None and (bias.dtype != torch.float32 or bias.numel() != w.N or not bias.is_contiguous()):
        raise ValueError(f"c_linear: the bias must be {w.N} contiguous float32s")
    b = None if bias is None else bias.data_ptr()
    held = () if bias is None else (bias,)
    if isinstance(w, c_gemm.F32Weight):
        return LinearC(w.packed.data_ptr(), None, None, b, w.N, w.K, 1), (w.packed, *held)
    struct = LinearC(w.packed.data_ptr(), w.comp.data_ptr(), w.scale.data_ptr(), b, w.N, w.K, 0)
    return struct, (w.packed, w.comp, w.scale, *held)


class SourceMap(ctypes.Structure):
    """csrc/beamserve.h's beamserve_source_map, built from source_of's numbers at each call (they stay plain
    numbers up to there, which torch.compile passes through its graph breaks as they are)."""

    _fields_ = [("lengths", ctypes.c_void_p), ("rows", ctypes.c_void_p)] + [
        (name, ctypes.c_int64) for name in ("rs", "ts", "rN", "rT")
    ]


class KV(ctypes.Structure):
    """csrc/beamserve.h's beamserve_kv: one layer's keys and values, and the lineage of the rows reading them."""

    _fields_ = [
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        *((name, ctypes.c_int64) for name in ("H", "D", "sN", "sH", "sT", "R", "T")),
        ("lineage", ctypes.c_void_p),
        *((name, ctypes.c_int64) for name in ("lN", "lT", "rN", "rT")),
        ("scale", ctypes.c_float),
    ]


class LayerC(ctypes.Structure):
    """csrc/beamserve.h's beamserve_layer_c: one decoder layer's structs for decoder_segment (fc1's packed pointer
    None: fc1 runs outside, float32), its three LayerNorms' weights, biases and eps, and whether they come first."""

    _fields_ = [
        *((name, LinearC) for name in ("self_in", "self_out", "cross_in", "cross_out", "fc1", "fc2")),
        ("norm_weight", ctypes.c_void_p * 3),
        ("norm_bias", ctypes.c_void_p * 3),
        ("eps", ctypes.c_float * 3),
        ("pre", ctypes.c_int64),
    ]


def layer_c(
    linears: tuple[LinearC, LinearC, LinearC, LinearC, LinearC | None, LinearC],
    norms: tuple[tuple[torch.Tensor, torch.Tensor, float], ...],
    pre: bool,
) -> LayerC:
    """The struct for one layer: its six linears' structs (fc1 None: float32, outside), its three norms (weight and
    bias of C contiguous float32s, eps), post- or pre-norm. The caller holds what the structs point into."""
    C = linears[0].K
    if len(norms) != 3 or not all(
        w.dtype == b.dtype == torch.float32 and w.shape == b.shape == (C,) and w.is_contiguous() and b.is_contiguous()
        for w, b, _ in norms
    ):
        raise ValueError(f"layer_c: three norms of {C} contiguous float32 weights and biases")
    fc1 = linears[4] if linears[4] is not None else LinearC(None, None, None, None, 0, 0, 0)
    return LayerC(
        *linears[:4], fc1, linears[5],
        (ctypes.c_void_p * 3)(*(w.data_ptr() for w, _, _ in norms)),
        (ctypes.c_void_p * 3)(*(b.data_ptr() for _, b, _ in norms)),
        (ctypes.c_float * 3)(*(eps for _, _, eps in norms)),
        int(pre),
    )  # fmt: skip


def decoder_segment(
    ending: LayerC | None,
    h: torch.Tensor | None,
    layer: LayerC | None,
    own: KV | None,
    source_kv: KV | None,
    positions: tuple[int | None, int],
    source: tuple[int, ...],
    x: torch.Tensor,
    u: torch.Tensor,
    f: torch.Tensor | None,
) -> None:
    """csrc/sublayers.c's beamserve_decoder_segment, its inputs checked by the caller (model/nn/c_step.py: x and u
    (N, C), h (N, ending's fc2.K) and f (N, layer's fc1.N) float32 contiguous, the KV structs of C = H x D, the
    positions and source of positions_of and source_of): layer `ending`'s feed-forward closed over h, then
    `layer`'s attention sublayers, x updated in place, u its feed-forward's input, f = fc1(u) where fc1 is in C."""
    failed = native.kernels().beamserve_decoder_segment(
        None if ending is None else ctypes.byref(ending), None if h is None else h.data_ptr(),
        None if layer is None else ctypes.byref(layer), None if own is None else ctypes.byref(own),
        None if source_kv is None else ctypes.byref(source_kv), *positions, ctypes.byref(SourceMap(*source)),
        x.shape[0], x.shape[1], x.data_ptr(), u.data_ptr(), None if f is None else f.data_ptr(),
    )  # fmt: skip
    raise_sublayer(failed, "decoder_segment")


def decoder_layers(
    layers: ctypes.Array[ctypes.c_void_p],
    own: ctypes.Array[ctypes.c_void_p],
    source_kv: ctypes.Array[ctypes.c_void_p],
    positions: tuple[int | None, int],
    source: tuple[int, ...],
    x: torch.Tensor,
    output: LinearC | None = None,
) -> torch.Tensor | None:
    """csrc/sublayers.c's beamserve_decoder_layers, its inputs checked by the caller (model/nn/c_step.py): every
    decoder layer of a step in one call, x (N, C) float32 contiguous updated in place; layers, own and source_kv
    the addresses of each layer's LayerC (fc1 in C) and KV structs; each feed-forward activated by silu_ (where
    silu_exactly()). With `output` (a struct of c_linear), then x's output projection and each row's
    log-softmax -> (N, output.N); else None."""
    N, C = x.shape
    logp = None if output is None else torch.empty(N, output.N)
    failed = native.kernels().beamserve_decoder_layers(
        layers, own, source_kv, len(layers), *positions, ctypes.byref(SourceMap(*source)), N, C, x.data_ptr(),
        None if output is None else ctypes.byref(output), None if logp is None else logp.data_ptr(),
    )  # fmt: skip
    raise_sublayer(failed, "decoder_layers")
    return logp


def encoder_segment(
    ending: LayerC | None,
    h: torch.Tensor | None,
    layer: LayerC | None,
    heads: int,
    sentences: tuple[int, int],
    source: tuple[int, ...],
    x: torch.Tensor,
    u: torch.Tensor,
    f: torch.Tensor | None,
) -> None:
    """csrc/sublayers.c's beamserve_encoder_segment, its inputs checked by the caller (model/nn/c_encode.py: x and u
    (B S, C), h (B S, ending's fc2.K) and f (B S, layer's fc1.N) float32 contiguous; sentences (B, S); source as
    source_of gives it, each row's length and sentence): layer `ending`'s feed-forward closed over h, then `layer`'s
    self-attention sublayer, x updated in place, u its feed-forward's input, f = fc1(u) where fc1 is in C."""
    C = x.shape[1]
    failed = native.kernels().beamserve_encoder_segment(
        None if ending is None else ctypes.byref(ending), None if h is None else h.data_ptr(),
        None if layer is None else ctypes.byref(layer), *sentences, heads, ctypes.byref(SourceMap(*source)),
        (C // heads) ** -0.5, x.shape[0], C, x.data_ptr(), u.data_ptr(), None if f is None else f.data_ptr(),
    )  # fmt: skip
    raise_sublayer(failed, "encoder_segment")


def encoder_layers(
    layers: ctypes.Array[ctypes.c_void_p],
    heads: int,
    sentences: tuple[int, int],
    source: tuple[int, ...],
    x: torch.Tensor,
) -> None:
    """csrc/sublayers.c's beamserve_encoder_layers, its inputs checked by the caller (model/nn/c_encode.py): every
    encoder layer in one call, x (B S, C) float32 contiguous updated in place, layers the addresses of each
    layer's LayerC (fc1 in C, `heads` heads), each feed-forward activated as decoder_layers does it."""
    C = x.shape[1]
    failed = native.kernels().beamserve_encoder_layers(
        layers,
        len(layers),
        heads,
        *sentences,
        ctypes.byref(SourceMap(*source)),
        (C // heads) ** -0.5,
        x.shape[0],
        C,
        x.data_ptr(),
    )
    raise_sublayer(failed, "encoder_layers")


def embed(tokens: torch.Tensor, weight: torch.Tensor, scale: float, at: torch.Tensor) -> torch.Tensor:
    """A decode step's input rows in one call: weight[tokens] * scale + at, tokens (N,) int64, weight (V, C) and at
    ((1 or N), C) float32 contiguous; the bits of F.embedding(tokens, weight) * scale + at. IndexError where a
    token is not below V, as F.embedding raises."""
    N, (V, C) = tokens.numel(), weight.shape
    if not (
        tokens.dtype == torch.int64 and tokens.dim() == 1 and weight.dtype == at.dtype == torch.float32
        and at.dim() == 2 and at.shape[1] == C and at.shape[0] in (1, N)
        and all(t.is_contiguous() for t in (tokens, weight, at))
    ):  # fmt: skip
        raise ValueError(f"embed: tokens (N,) int64, weight (V, {C}) and at (1 or N, {C}) float32, contiguous")
    x = torch.empty(N, C)
    stride = C if at.shape[0] == N and N > 1 else 0
    failed = native.kernels().beamserve_embed(
        tokens.data_ptr(), N, weight.data_ptr(), V, C, scale, at.data_ptr(), stride, x.data_ptr()
    )
    if failed:
        raise IndexError(f"embed: a token id outside the vocabulary of {V}")
    return x


def kv_view(k: torch.Tensor, v: torch.Tensor, lineage: torch.Tensor | None) -> KV:
    """The struct for k, v (R, H, T, D) float32 alike with unit stride over D, and a lineage (R', T') int64 or None.
    The caller holds the tensors as long as the struct."""
    if not (
        k.dtype == v.dtype == torch.float32 and k.dim() == 4 and k.shape == v.shape and k.stride() == v.stride()
        and k.stride(3) == 1 and 0 < k.shape[3] <= c_attention.MOST_HEAD_DIM
    ):  # fmt: skip
        raise ValueError("kv_view: k and v (R, H, T, D) float32 alike, unit stride over D")
    R, H, T, D = k.shape
    lin, lN, lT, rN, rT = None, 0, 0, 0, 0
    if lineage is not None:
        if lineage.dtype != torch.int64 or lineage.dim() != 2:
            raise ValueError("kv_view: the lineage must be (R', T') int64")
        lin, (lN, lT), (rN, rT) = lineage.data_ptr(), lineage.stride(), lineage.shape
    sN, sH, sT, _ = k.stride()
    return KV(k.data_ptr(), v.data_ptr(), H, D, sN, sH, sT, R, T, lin, lN, lT, rN, rT, D**-0.5)


def _rows_in(name: str, x: torch.Tensor, residual: torch.Tensor, C: int) -> None:
    if not (
        x.dtype == residual.dtype == torch.float32 and x.dim() == 2 and x.shape[1] == C and x.is_contiguous()
        and residual.shape == x.shape and residual.is_contiguous()
    ):  # fmt: skip
        raise ValueError(f"{name}: x and the residual (N, {C}) float32, contiguous")


def raise_sublayer(failed: int, name: str) -> None:
    if failed == -2:
        raise IndexError(f"{name}: the weights' shapes disagree, or a position or a row lies outside the cache")
    if failed:
        raise RuntimeError(f"{name}: no memory for the sublayer's rows, or no kernel for its weights in this build")


def self_sublayer(
    x: torch.Tensor, residual: torch.Tensor, qkv: LinearC, out: LinearC, kv: KV, pos: int | torch.Tensor
) -> torch.Tensor:
    """residual + out(self-attention(qkv(x))) for a step's rows x (N, C), each row's key and value written at its
    position first (pos: one for every row, or (N,) int64), in one call: the bits of project_qkv, self_attend_step
    and out_proj with the residual in turn. Only where the structs' kernels run."""
    _rows_in("self_sublayer", x, residual, kv.H * kv.D)
    positions = positions_of(pos, x.shape[0])
    if positions is None:
        raise ValueError(f"self_sublayer: {x.shape[0]} contiguous int64 positions")
    return self_sublayer_checked(x, residual, qkv, out, kv, positions)


def cross_sublayer(
    x: torch.Tensor,
    residual: torch.Tensor,
    q: LinearC,
    out: LinearC,
    kv: KV,
    row_map: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """residual + out(cross-attention(q(x))) for a step's rows x (N, C) in one call, each row over its sentence's
    source as CrossCache.row_map gives it: the bits of q_proj, attend and out_proj with the residual. Only where
    the structs' kernels run."""
    _rows_in("cross_sublayer", x, residual, kv.H * kv.D)
    source = source_of(row_map, x.shape[0])
    if source is None:
        raise ValueError(f"cross_sublayer: {x.shape[0]} contiguous int64 lengths and (N, S) int64 rows")
    return cross_sublayer_checked(x, residual, q, out, kv, source)


def linear_forward(w: LinearC, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """x (M, K) float32 contiguous @ w^T + its bias, plus residual (M, N) where given, by the struct of c_linear:
    the bits of vnni_linear or f32_linear with one call's checks. Only where the struct's kernel runs."""
    if not (x.dtype == torch.float32 and x.dim() == 2 and x.shape[1] == w.K and x.is_contiguous()):
        raise ValueError(f"linear_forward: x (M, {w.K}) float32, contiguous")
    M = x.shape[0]
    if residual is not None and not (
        residual.dtype == torch.float32 and residual.shape == (M, w.N) and residual.is_contiguous()
    ):
        raise ValueError(f"linear_forward: the residual ({M}, {w.N}) float32, contiguous")
    return linear_forward_checked(w, x, residual)


def positions_of(pos: int | torch.Tensor, rows: int) -> tuple[int | None, int] | None:
    """pos as self_sublayer_checked takes it: (a pointer to `rows` int64 positions or None, the one position of
    every row); None where pos is neither an int nor `rows` contiguous int64."""
    if isinstance(pos, int):
        return None, pos
    if pos.dtype == torch.int64 and pos.numel() == rows and pos.is_contiguous():
        return pos.data_ptr(), 0
    return None


def source_of(row_map: tuple[torch.Tensor, torch.Tensor], rows: int) -> tuple[int, ...] | None:
    """CrossCache.row_map as cross_sublayer_checked takes it (its lengths, and its rows with their strides and
    shape); None where it is not `rows` contiguous int64 lengths and (rows, S) int64 rows."""
    lengths, sentence_rows = row_map
    if not (
        lengths.dtype == sentence_rows.dtype == torch.int64 and lengths.numel() >= rows and lengths.is_contiguous()
        and sentence_rows.dim() == 2
    ):  # fmt: skip
        return None
    return (lengths.data_ptr(), sentence_rows.data_ptr(), *sentence_rows.stride(), *sentence_rows.shape)


def self_sublayer_checked(
    x: torch.Tensor, residual: torch.Tensor, qkv: LinearC, out: LinearC, kv: KV, positions: tuple[int | None, int]
) -> torch.Tensor:
    """self_sublayer once x, the residual (against kv's H x D) and positions_of(pos) have been checked."""
    y = torch.empty_like(x)
    failed = native.kernels().beamserve_self_sublayer(
        x.data_ptr(), residual.data_ptr(), x.shape[0], ctypes.byref(qkv), ctypes.byref(out), ctypes.byref(kv),
        *positions, y.data_ptr(),
    )  # fmt: skip
    raise_sublayer(failed, "self_sublayer")
    return y


def cross_sublayer_checked(
    x: torch.Tensor, residual: torch.Tensor, q: LinearC, out: LinearC, kv: KV, source: tuple[int, ...]
) -> torch.Tensor:
    """cross_sublayer once x, the residual (against kv's H x D) and source_of(row_map) have been checked."""
    y = torch.empty_like(x)
    failed = native.kernels().beamserve_cross_sublayer(
        x.data_ptr(), residual.data_ptr(), x.shape[0], ctypes.byref(q), ctypes.byref(out), ctypes.byref(kv),
        ctypes.byref(SourceMap(*source)), y.data_ptr(),
    )  # fmt: skip
    raise_sublayer(failed, "cross_sublayer")
    return y


def linear_forward_checked(w: LinearC, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    """linear_forward once x (M, w.K) and the residual (M, w.N) have been checked."""
    y = torch.empty(x.shape[0], w.N)
    r = None if residual is None else residual.data_ptr()
    failed = native.kernels().beamserve_linear_forward(ctypes.byref(w), x.data_ptr(), x.shape[0], r, y.data_ptr())
    native.raise_for(failed, "linear_forward")
    return y
