"""A decode step's decoder layers as one loop of C calls (model/kernels/native.py) and ATen's layer norms.

A one-sentence step is a few hundred microseconds, and each checked wrapper of native.py, each module attribute
lookup and each struct lookup costs about a microsecond of them: a plan made at a decode's first step of a row
count holds every layer's structs, norms and activation, the step's arguments are checked once, and each
sublayer is one call of the library. The operations, their inputs and their order are
DecoderLayer.sublayers' in C (post-norm: LayerNorm(x + f(x)); pre-norm: x + f(LayerNorm(x))), through the same
structs (MultiHeadAttention.c_sublayer, FeedForward's C linears): the same bits, which tests/test_native.py holds
against the layer-by-layer path.

Where C computes the feed-forward's SiLU with the bits of the path it replaces (_chain), the whole step is one
call: every layer, then the output projection and the log-softmax (run's `output`). One sentence at a time the Python
and PyTorch calls between the segments cost more than their arithmetic, the more so where the weights streamed
through the caches every step evict the interpreter's data (docs/benchmarks.md).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from model.kernels import c_layers, c_linears, execution
from model.nn.layers import feed_forward_in_c, hidden_rows, weights_states

if TYPE_CHECKING:
    from model.nn.blocks import DecoderLayer
    from model.nn.kv_cache import CrossCache, KVCache

Norm = tuple[tuple[int, ...], torch.Tensor, torch.Tensor, float]  # normalized_shape, weight, bias, eps


@dataclass(frozen=True)
class LayerPart:
    """One decoder layer's part of a step: its structs at the plan's row count, its norms and activation."""

    pre: bool
    self_in: c_layers.LinearC  # q, k and v fused
    self_out: c_layers.LinearC
    cross_in: c_layers.LinearC
    cross_out: c_layers.LinearC
    fc1: c_layers.LinearC | None  # None: float32, oneDNN's with the activation fused
    fc2: c_layers.LinearC
    fc1_float: tuple[torch.Tensor, torch.Tensor | None]
    activation: str
    norms: tuple[Norm, Norm, Norm]
    whole: c_layers.LayerC | None  # the layer for c_layers.decoder_segment, where LayerNorm in C has torch's bits
    # What the structs point into (the modules' cached forms, with their tensors), held as long as the plan: a
    # form the modules replace stays valid memory for a plan that still has it.
    held: tuple[object, ...]
    # in_one_call's answer by (rows, intra-op threads, SiLU in C): a float32 layer's is a struct of its own, made once
    one_call: dict[tuple[int, int, bool], c_layers.LayerC | None] = field(default_factory=dict, compare=False)


StepParts = tuple[LayerPart, ...]  # every decoder layer's part of a step at one row count


def run(
    layers: Sequence[DecoderLayer],
    x: torch.Tensor,
    pos: int | torch.Tensor,
    cache: KVCache,
    cross: CrossCache,
    row_map: tuple[torch.Tensor, torch.Tensor],
    output: c_layers.LinearC | None = None,
) -> tuple[torch.Tensor, bool] | None:
    """x (N, C) through every decoder layer of a step, each row's key and value written at pos (one for every row,
    or (N,) int64) of `cache`, each row reading its sentence's source through row_map -> (x, False); with
    `output` (a struct of c_layers.c_linear), where the step is one library call (_chain), the output projection
    and each row's log-softmax in that call too -> ((N, V), True). None, having computed nothing, where a
    sublayer does not run in C at N rows (the caller takes the layer-by-layer path)."""
    N, C = x.shape
    plan = _plan(layers, N, cache.__dict__)
    if plan is None:
        return None
    positions, source = c_layers.positions_of(pos, N), c_layers.source_of(row_map, N)
    if not (x.dtype == torch.float32 and x.is_contiguous()) or positions is None or source is None:
        return None
    if plan[0].whole is not None:
        x = x.clone()  # the residual stream, updated in place
        chain = _chain(plan, N, C, cache, cross, layers[0].plan)
        if chain is not None:
            logp = c_layers.decoder_layers(*chain, positions, source, x, output)
            return (x, False) if logp is None else (logp, True)
        return _by_segments(plan, x, positions, source, cache, cross), False
    for i, layer in enumerate(plan):
        kv, memory = _views(i, C, cache, cross)
        n1, n2, n3 = layer.norms
        own = (layer.self_in, layer.self_out, kv, positions)
        other = (layer.cross_in, layer.cross_out, memory, source)
        if layer.pre:  # x + f(LayerNorm(x))
            x = c_layers.self_sublayer_checked(torch.native_layer_norm(x, *n1)[0], x, *own)
            x = c_layers.cross_sublayer_checked(torch.native_layer_norm(x, *n2)[0], x, *other)
            x = _feed_forward(layer, torch.native_layer_norm(x, *n3)[0], x)
        else:  # LayerNorm(x + f(x))
            x = torch.native_layer_norm(c_layers.self_sublayer_checked(x, x, *own), *n1)[0]
            x = torch.native_layer_norm(c_layers.cross_sublayer_checked(x, x, *other), *n2)[0]
            x = torch.native_layer_norm(_feed_forward(layer, x, x), *n3)[0]
    return x, False


def one_call(
    layers: Sequence[DecoderLayer],
    N: int,
    C: int,
    cache: KVCache,
    cross: CrossCache,
    row_map: tuple[torch.Tensor, torch.Tensor],
) -> tuple[Chain, tuple[int, ...]] | None:
    """The step's layers at N rows of C as c_layers.decoder_layers takes them (_chain), and the source map
    (source_of), where run would make the step one call; None elsewhere."""
    plan = _plan(layers, N, cache.__dict__)
    source = c_layers.source_of(row_map, N)
    if plan is None or plan[0].whole is None or source is None:
        return None
    chain = _chain(plan, N, C, cache, cross, layers[0].plan)
    return None if chain is None else (chain, source)


def _by_segments(
    plan: StepParts,
    x: torch.Tensor,
    positions: tuple[int | None, int],
    source: tuple[int, ...],
    cache: KVCache,
    cross: CrossCache,
) -> torch.Tensor:
    """The layers as one C call between each two feed-forward activations (c_layers.decoder_segment), the
    activation (and float32's fc1 with it) in PyTorch between them: the same operations in the same order. x is
    the residual stream, updated in place."""
    N, C = x.shape
    u = torch.empty_like(x)
    ending: LayerPart | None = None
    h: torch.Tensor | None = None
    for i, layer in enumerate(plan):
        kv, memory = _views(i, C, cache, cross)
        f = None if layer.fc1 is None else torch.empty(N, layer.fc1.N)
        c_layers.decoder_segment(
            None if ending is None else ending.whole, h, layer.whole, kv, memory, positions, source, x, u, f
        )
        h = hidden_rows(u, f, layer.fc1_float, layer.activation)
        ending = layer
    assert ending is not None
    c_layers.decoder_segment(ending.whole, h, None, None, None, positions, source, x, u, None)
    return x


Chain = tuple["ctypes.Array[ctypes.c_void_p]", "ctypes.Array[ctypes.c_void_p]", "ctypes.Array[ctypes.c_void_p]"]


def _chain(plan: StepParts, N: int, C: int, cache: KVCache, cross: CrossCache, kernels: execution.Plan) -> Chain | None:
    """The step's layers as c_layers.decoder_layers takes them (each LayerC, self-attention KV and source KV by its
    address), where that one call computes what the segments and the activations between them would: every
    activation SiLU, each layer's fc1 in C and its SiLU with the bits of the path it replaces (see
    _layer_in_one_call). Made once per plan and set of cache views; None elsewhere (`kernels.one_call` off
    among them, to measure the one call against the segments)."""
    if torch.compiler.is_compiling() or not kernels.one_call:  # traced: the segments, as operators
        return None
    held = cache.__dict__.get("_c_step_chain")
    own, source = cache._views, cross._views
    if (
        held is not None and own is not None and source is not None and held[1] is plan and held[2] is own
        and held[3] is source and own[0] is cache.k and source[0] is cross.k
    ):  # fmt: skip
        return held[0]
    views = [_views(i, C, cache, cross) for i in range(len(plan))]  # made once per buffer: the key below
    layers = [_layer_in_one_call(layer, N, kernels) for layer in plan]
    chain = None
    if all(layers):
        addresses = (
            [ctypes.addressof(layer) for layer in layers if layer is not None],
            [ctypes.addressof(kv) for kv, _ in views],
            [ctypes.addressof(memory) for _, memory in views],
        )
        chain = tuple((ctypes.c_void_p * len(plan))(*a) for a in addresses)
    # The answer (None too) for this plan and these buffers' views, with the structs its addresses are of.
    cache.__dict__["_c_step_chain"] = (chain, plan, cache._views, cross._views, layers)
    return chain  # type: ignore[return-value]


def _layer_in_one_call(layer: LayerPart, N: int, plan: execution.Plan) -> c_layers.LayerC | None:
    if layer.whole is None:
        return None
    key = (N, torch.get_num_threads(), plan.silu_in_c)
    if key not in layer.one_call:
        whole, fc1_in_c = layer.whole, layer.fc1 is not None
        layer.one_call[key] = in_one_call(whole, fc1_in_c, layer.fc1_float, layer.activation, N, plan)
    return layer.one_call[key]


def in_one_call(
    whole: c_layers.LayerC,
    fc1_in_c: bool,
    fc1_float: tuple[torch.Tensor, torch.Tensor | None],
    activation: str,
    N: int,
    plan: execution.Plan,
) -> c_layers.LayerC | None:
    """A layer's struct for c_layers.decoder_layers or encoder_layers at N rows, or None where that call would not
    give the bits of the segments and activations between them. int8 (fc1_in_c): fc1 in C already, then torch's
    SiLU, which csrc/silu.c gives where c_linears.silu_exact_at says so. float32: oneDNN's fc1 with its swish
    post-op, which the C GEMM and c_gemm.f32_swish_ give where c_linears.swish_fc1 makes the struct (a copy of the
    layer's with that fc1 filled in)."""
    if activation != "swish":
        return None
    weight, bias = fc1_float
    if fc1_in_c:
        return whole if c_linears.silu_exact_at(N, weight.shape[0], plan) else None
    made = c_linears.swish_fc1(weight, bias, N)
    if made is None:
        return None
    fc1, tensors, form = made
    filled = c_layers.LayerC.from_buffer_copy(whole)
    filled.fc1 = fc1
    filled.__dict__["held"] = (whole, form, tensors)  # what its pointers are into
    return filled


def _views(i: int, C: int, cache: KVCache, cross: CrossCache) -> tuple[c_layers.KV, c_layers.KV]:
    """Layer i's self-attention and source keys and values, checked against rows of C."""
    kv, memory = cache.view(i), cross.view(i)
    if kv.H * kv.D != C or memory.H * memory.D != C:
        raise ValueError(f"decoder layer {i}: keys of {kv.H} x {kv.D} and {memory.H} x {memory.D}, rows of {C}")
    return kv, memory


def _feed_forward(layer: LayerPart, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    return feed_forward_in_c(
        h, residual, layer.fc1, layer.fc2, layer.fc1_float, layer.activation, c_layers.linear_forward_checked
    )


def _plan(layers: Sequence[DecoderLayer], rows: int, held: dict[str, object]) -> StepParts | None:
    """The plan for `rows` rows for the weights as they are; None where a sublayer does not run in C at that row
    count. Made once and kept on the first layer across decodes (_plans), the weights checked at a decode's first
    step (`held` is the decode's self-attention cache: the weights do not change while a decode runs)."""
    plans: dict[int, StepParts | None] | None = held.get("_c_step_plans")  # type: ignore[assignment]
    if plans is None:
        plans = held["_c_step_plans"] = _plans(layers)
    if rows not in plans:
        plans[rows] = _made(layers, rows)
    return plans[rows]


def _plans(layers: Sequence[DecoderLayer]) -> dict[int, StepParts | None]:
    """The plans kept for the layers' weights as they are: each sublayer's weights, biases and int8 forms (what
    their structs are made from, weights_state), each norm's parameters and whether a layer trains; a new set
    where any of those changed. A plan is some hundred microseconds to check layer by layer, each of a
    sentence's decodes making two."""
    key, objects = weights_states(
        [
            pair
            for layer in layers
            for pair in (
                (layer.self_attn, ("q_proj", "k_proj", "v_proj", "out_proj")),
                (layer.cross_attn, ("q_proj", "out_proj")),
                (layer.ffn, ("fc1", "fc2")),
            )
        ]
    )
    norms = [t for layer in layers for n in (layer.norm1, layer.norm2, layer.norm3) for t in n._parameters.values()]
    plans = [layer.plan for layer in layers]  # which kernels: a part's whole-layer struct is the plan's choice
    key += (len(layers), *(id(t) for t in norms), *(layer.training for layer in layers), *(id(p) for p in plans))
    objects += [*norms, *plans]
    kept: tuple[tuple[object, ...], list[object], dict[int, StepParts | None]] | None = layers[0].__dict__.get(
        "_c_step_plans"
    )
    if kept is None or kept[0] != key:  # the objects compared by id are held with the plans
        kept = layers[0].__dict__["_c_step_plans"] = (key, objects, {})
    return kept[2]


def _made(layers: Sequence[DecoderLayer], rows: int) -> StepParts | None:
    parts = []
    for layer in layers:
        part = None if layer.training else _part(layer, rows)
        if part is None:
            return None
        parts.append(part)
    return tuple(parts)


def _part(layer: DecoderLayer, rows: int) -> LayerPart | None:
    """The layer's part at `rows` rows, kept on the layer for its structs and norms as they are (the modules remake
    a struct when its weights change: a new struct is a new part); None where a sublayer does not run in C."""
    own = layer.self_attn.c_sublayer(rows, fused=True)
    source = layer.cross_attn.c_sublayer(rows, fused=False)
    ffn = layer.ffn._c_linears(rows)
    if own is None or source is None or ffn is None:
        return None
    norms = tuple(
        (tuple(n.normalized_shape), n._parameters["weight"], n._parameters["bias"], n.eps)
        for n in (layer.norm1, layer.norm2, layer.norm3)
    )
    key = (*(id(s) for s in (*own, *source, *ffn)), *(id(t) for _, w, b, _ in norms for t in (w, b)), id(layer.plan))
    held: dict[int, tuple[tuple[int, ...], LayerPart]] = layer.__dict__.setdefault("_c_step_parts", {})
    found = held.get(rows)
    if found is not None and found[0] == key:
        return found[1]
    fc1 = layer.ffn.fc1
    affine = [(w, b, eps) for _, w, b, eps in norms if w is not None and b is not None]
    whole = None
    if layer.plan.layer_norm_in_c and len(affine) == 3:  # each norm with its weight and bias
        whole = c_layers.layer_c((*own, *source, *ffn), tuple(affine), layer.pre)
    forms = (
        layer.self_attn.__dict__["_c_sublayer"][True],
        layer.cross_attn.__dict__["_c_sublayer"][False],
        layer.ffn.__dict__["_c_pair"],
    )
    part = LayerPart(
        layer.pre,
        *own,
        *source,
        *ffn,
        (fc1.weight, fc1.bias),
        layer.ffn.activation,
        norms,  # type: ignore[arg-type]
        whole,
        (forms, norms, layer.plan),
    )
    held[rows] = (key, part)
    return part
