"""A decode step's decoder layers as one loop of C calls (model/kernels/native.py) and ATen's layer norms.

A one-sentence step is a few hundred microseconds, and each checked wrapper of native.py, each module attribute
lookup and each struct lookup costs about a microsecond of them: a plan made at a decode's first step of a row
count holds every layer's structs, norms and activation, the step's arguments are checked once, and each
sublayer is one call of the library. The operations, their inputs and their order are
DecoderLayer.sublayers' in C (post-norm: LayerNorm(x + f(x)); pre-norm: x + f(LayerNorm(x))), through the same
structs (MultiHeadAttention.c_sublayer, FeedForward's C linears): the same bits, which tests/test_native.py holds
against the layer-by-layer path.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from model.kernels import native
from model.kernels.gemm import INPLACE_ACTIVATIONS, linear

if TYPE_CHECKING:
    from model.nn.kv_cache import CrossCache, KVCache
    from model.nn.transformer import DecoderLayer

Norm = tuple[tuple[int, ...], torch.Tensor, torch.Tensor, float]  # normalized_shape, weight, bias, eps


@dataclass(frozen=True)
class LayerPlan:
    """One decoder layer's part of a step: its structs at the plan's row count, its norms and activation."""

    pre: bool
    self_in: native.LinearC  # q, k and v fused
    self_out: native.LinearC
    cross_in: native.LinearC
    cross_out: native.LinearC
    fc1: native.LinearC | None  # None: float32, oneDNN's with the activation fused
    fc2: native.LinearC
    fc1_float: tuple[torch.Tensor, torch.Tensor | None]
    activation: str
    act: Callable[[torch.Tensor], torch.Tensor]  # in place
    norms: tuple[Norm, Norm, Norm]
    # What the structs point into (the modules' cached forms, with their tensors), held as long as the plan: a
    # form the modules replace stays valid memory for a plan that still has it.
    held: tuple[object, ...]


@dataclass(frozen=True)
class Plan:
    rows: int
    layers: tuple[LayerPlan, ...]


def run(
    layers: Sequence[DecoderLayer],
    x: torch.Tensor,
    pos: int | torch.Tensor,
    cache: KVCache,
    cross: CrossCache,
    row_map: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor | None:
    """x (N, C) through every decoder layer of a step, each row's key and value written at pos (one for every row,
    or (N,) int64) of `cache`, each row reading its sentence's source through row_map; None, having computed
    nothing, where a sublayer does not run in C at N rows (the caller takes the layer-by-layer path)."""
    N, C = x.shape
    plan = _plan(layers, N, cache.__dict__)
    if plan is None:
        return None
    lengths, rows = row_map
    if not (
        x.dtype == torch.float32 and x.is_contiguous() and lengths.dtype == rows.dtype == torch.int64
        and lengths.numel() >= N and lengths.is_contiguous() and rows.dim() == 2
    ):  # fmt: skip
        return None
    positions, at = None, 0
    if isinstance(pos, int):
        at = pos
    elif pos.dtype == torch.int64 and pos.numel() == N and pos.is_contiguous():
        positions = pos.data_ptr()
    else:
        return None
    lib = native.library()
    crossing = (lengths.data_ptr(), rows.data_ptr(), rows.stride(0), rows.stride(1), *rows.shape)
    for i, layer in enumerate(plan.layers):
        kv, source = cache.view(i), cross.view(i)
        if kv.H * kv.D != C or source.H * source.D != C:
            raise ValueError(f"decoder layer {i}: keys of {kv.H} x {kv.D} and {source.H} x {source.D}, rows of {C}")
        n1, n2, n3 = layer.norms
        own = (layer.self_in, layer.self_out, kv, positions, at)
        other = (layer.cross_in, layer.cross_out, source, crossing)
        if layer.pre:  # x + f(LayerNorm(x))
            x = _self(lib, torch.native_layer_norm(x, *n1)[0], x, *own)
            x = _cross(lib, torch.native_layer_norm(x, *n2)[0], x, *other)
            x = _feed_forward(lib, layer, torch.native_layer_norm(x, *n3)[0], x)
        else:  # LayerNorm(x + f(x))
            x = torch.native_layer_norm(_self(lib, x, x, *own), *n1)[0]
            x = torch.native_layer_norm(_cross(lib, x, x, *other), *n2)[0]
            x = torch.native_layer_norm(_feed_forward(lib, layer, x, x), *n3)[0]
    return x


def _self(
    lib: ctypes.CDLL,
    h: torch.Tensor,
    residual: torch.Tensor,
    qkv: native.LinearC,
    out: native.LinearC,
    kv: native.KV,
    positions: int | None,
    at: int,
) -> torch.Tensor:
    """native.self_sublayer's call, its arguments checked by run."""
    y = torch.empty_like(h)
    failed = lib.beamserve_self_sublayer(
        h.data_ptr(), residual.data_ptr(), h.shape[0], ctypes.byref(qkv), ctypes.byref(out), ctypes.byref(kv),
        positions, at, y.data_ptr(),
    )  # fmt: skip
    native.raise_sublayer(failed, "self_sublayer")
    return y


def _cross(
    lib: ctypes.CDLL,
    h: torch.Tensor,
    residual: torch.Tensor,
    q: native.LinearC,
    out: native.LinearC,
    source: native.KV,
    crossing: tuple[int, ...],
) -> torch.Tensor:
    """native.cross_sublayer's call, its arguments checked by run."""
    y = torch.empty_like(h)
    failed = lib.beamserve_cross_sublayer(
        h.data_ptr(), residual.data_ptr(), h.shape[0], ctypes.byref(q), ctypes.byref(out), ctypes.byref(source),
        *crossing, y.data_ptr(),
    )  # fmt: skip
    native.raise_sublayer(failed, "cross_sublayer")
    return y


def _feed_forward(lib: ctypes.CDLL, layer: LayerPlan, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """FeedForward.forward's C path: fc1 and its activation in place, fc2 with the residual."""
    N = h.shape[0]
    if layer.fc1 is None:  # float32: fc1 is oneDNN's, its activation fused
        a = linear(h, *layer.fc1_float, layer.activation)
    else:
        a = torch.empty(N, layer.fc1.N)
        failed = lib.beamserve_linear_forward(ctypes.byref(layer.fc1), h.data_ptr(), N, None, a.data_ptr())
        native.raise_linear(failed, "fc1")
        layer.act(a)
    y = torch.empty_like(residual)
    failed = lib.beamserve_linear_forward(ctypes.byref(layer.fc2), a.data_ptr(), N, residual.data_ptr(), y.data_ptr())
    native.raise_linear(failed, "fc2")
    return y


def _plan(layers: Sequence[DecoderLayer], rows: int, held: dict[str, object]) -> Plan | None:
    """The plan for `rows` rows, made at a decode's first step of that many rows for the weights as they are
    (`held` is the decode's self-attention cache: the weights do not change while a decode runs); None where a
    sublayer does not run in C at that row count."""
    plans: dict[int, Plan | None] = held.setdefault("_c_step_plans", {})  # type: ignore[assignment]
    if rows not in plans:
        plans[rows] = _made(layers, rows)
    return plans[rows]


def _made(layers: Sequence[DecoderLayer], rows: int) -> Plan | None:
    parts = []
    for layer in layers:
        if layer.training:
            return None
        own = layer.self_attn.c_sublayer(rows, fused=True)
        source = layer.cross_attn.c_sublayer(rows, fused=False)
        ffn = layer.ffn._c_linears(rows)
        if own is None or source is None or ffn is None:
            return None
        norms = tuple(
            (tuple(n.normalized_shape), n._parameters["weight"], n._parameters["bias"], n.eps)
            for n in (layer.norm1, layer.norm2, layer.norm3)
        )
        fc1 = layer.ffn.fc1
        forms = (
            layer.self_attn.__dict__["_c_sublayer"][True],
            layer.cross_attn.__dict__["_c_sublayer"][False],
            layer.ffn.__dict__["_c_pair"],
        )
        parts.append(
            LayerPlan(
                layer.pre,
                *own,
                *source,
                *ffn,
                (fc1.weight, fc1.bias),
                layer.ffn.activation,
                INPLACE_ACTIVATIONS[layer.ffn.activation],
                norms,  # type: ignore[arg-type]
                forms,
            )
        )
    return Plan(rows, tuple(parts))
