"""The encoder's layers as one C call between each two feed-forward activations (c_layers.encoder_segment), for
inference on CPU where LayerNorm in C gives PyTorch's bits (the plan's layer_norm_in_c).

A sentence alone is a dozen rows: each layer op by op is some twenty library and ATen calls of a few
microseconds of work each. The calls here compute what EncoderLayer.forward does through its modules (q, k
and v as one projection: the same sums, model/nn/layers.py; each row's attention over its sentence's own
positions, padded rows too, as MultiHeadAttention._each_in_c; the residuals in the output projections' passes)
with the same kernels, so the bits are the same: tests/test_native.py holds them against the modules. Where C
computes the SiLU between them with the same bits (model/nn/c_step.py's in_one_call), every layer is one call
(c_layers.encoder_layers).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from model.kernels import c_layers, execution
from model.nn import c_step
from model.nn.layers import hidden_rows

if TYPE_CHECKING:
    from model.nn.blocks import EncoderLayer

# One encoder layer's part: its struct, its fc1 (weight, bias: float32's outside C), activation, heads, and what
# the struct points into.
Part = tuple[c_layers.LayerC, bool, tuple[torch.Tensor, torch.Tensor | None], str, int, tuple[object, ...]]
NONE = c_layers.LinearC(None, None, None, None, 0, 0, 0)  # the cross-attention an encoder layer has not


def run(layers: Sequence[EncoderLayer], x: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor | None:
    """x (B, S, C), src_mask (B, S) True on real tokens -> every encoder layer's output (B, S, C), as the layers
    give it; None, having computed nothing, where a layer does not run in C at B S rows."""
    B, S, C = x.shape
    N = B * S
    plan = layers[0].plan if layers else None
    if plan is None or not (plan.takes(x) and plan.layer_norm_in_c) or torch.is_grad_enabled():
        return None
    parts = [_part(layer, N) for layer in layers]
    if not parts or any(p is None for p in parts):
        return None
    lengths = src_mask.sum(-1).repeat_interleave(S)  # (N,) each row's sentence length
    sentence = torch.arange(B).repeat_interleave(S)[:, None].expand(N, S)  # each row's sentence at every position
    source = c_layers.source_of((lengths, sentence), N)
    assert source is not None
    x = x.reshape(N, C).clone()  # the residual stream, updated in place
    chain = _chain(layers, parts, N, plan)  # type: ignore[arg-type]
    if chain is not None:
        c_layers.encoder_layers(chain, parts[0][4], (B, S), source, x)  # type: ignore[index]
        return x.view(B, S, C)
    u = torch.empty_like(x)
    ending: Part | None = None
    h: torch.Tensor | None = None
    for part in parts:
        assert part is not None
        whole, fc1_in_c, fc1_float, activation, heads, _ = part
        f = torch.empty(N, fc1_float[0].shape[0]) if fc1_in_c else None
        c_layers.encoder_segment(None if ending is None else ending[0], h, whole, heads, (B, S), source, x, u, f)
        h = hidden_rows(u, f, fc1_float, activation)
        ending = part
    assert ending is not None
    c_layers.encoder_segment(ending[0], h, None, 1, (B, S), source, x, u, None)
    return x.view(B, S, C)


def _chain(
    layers: Sequence[EncoderLayer], parts: list[Part], N: int, plan: execution.Plan
) -> ctypes.Array[ctypes.c_void_p] | None:
    """The layers as c_layers.encoder_layers takes them (each LayerC by its address), where that one call gives the
    bits of the segments and the activations between them (c_step.in_one_call), every layer with the same heads;
    None elsewhere (the plan's one_call off among them). Kept on the first layer for these parts at N rows, this
    intra-op thread count and whether the plan computes the SiLU in C."""
    if torch.compiler.is_compiling() or not plan.one_call or len({p[4] for p in parts}) != 1:  # traced: the ops
        return None
    held: dict[int, tuple[tuple[int, ...], ctypes.Array[ctypes.c_void_p] | None, list[object]]]
    held = layers[0].__dict__.setdefault("_c_encode_chain", {})
    key = (torch.get_num_threads(), plan.silu_in_c, *(id(p[0]) for p in parts))
    found = held.get(N)
    if found is not None and found[0] == key:
        return found[1]
    structs = [c_step.in_one_call(p[0], p[1], p[2], p[3], N, plan) for p in parts]
    chain = None
    if all(structs):
        chain = (ctypes.c_void_p * len(parts))(*(ctypes.addressof(s) for s in structs if s is not None))
    held[N] = (key, chain, [*structs, *parts])  # the structs the addresses are of, and the parts' ids, held
    return chain


def _part(layer: EncoderLayer, rows: int) -> Part | None:
    """The layer's part at `rows` rows, made once for its structs as they are (the modules remake a struct when
    its weights change: a new struct is a new part); None where a sublayer does not run in C at that count."""
    if layer.training:
        return None
    own = layer.self_attn.c_sublayer(rows, fused=True)
    ffn = layer.ffn._c_linears(rows)
    if own is None or ffn is None:
        return None
    parts: dict[int, tuple[tuple[int, ...], Part | None]] = layer.__dict__.setdefault("_c_encode", {})
    key = tuple(id(s) for s in (*own, *ffn))
    held = parts.get(rows)
    if held is not None and held[0] == key:
        return held[1]
    norms = [(n._parameters["weight"], n._parameters["bias"], n.eps) for n in (layer.norm1, layer.norm1, layer.norm2)]
    affine = [(w, b, eps) for w, b, eps in norms if w is not None and b is not None]
    part: Part | None = None
    if len(affine) == 3:  # the struct's middle norm (the decoder's cross-attention's) is not read
        fc1 = layer.ffn.fc1
        whole = c_layers.layer_c((*own, NONE, NONE, *ffn), tuple(affine), layer.pre)
        forms = (layer.self_attn.__dict__["_c_sublayer"][True], layer.ffn.__dict__["_c_pair"])
        part = (whole, ffn[0] is not None, (fc1.weight, fc1.bias), layer.ffn.activation, layer.self_attn.heads, forms)
    parts[rows] = (key, part)
    return part
