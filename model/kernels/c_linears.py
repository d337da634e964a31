"""Which C GEMM serves a layer's weights at a row count: the structs of c_layers.c_linear for a decode step's and
the encoder's library calls, made from a weight's forms, and the row counts each serves.

An int8 weight computes in C where its plan (int8_choice, measured at load) takes the packed VNNI kernel at that
row count; a float32 one where f32_gemm's kernel gives oneDNN's bits at its shape, up to f32_gemm.most_rows. The
layers of model/nn hand their weights here and take the structs or None; which kernel that is stays here.
"""

from __future__ import annotations

import torch

from model.kernels import c_gemm, c_layers, execution, f32_gemm, native
from model.kernels.int8_choice import kernel_at
from model.kernels.quant import Int8Weight

# What serves a layer in C: its structs, the tensors they point into, and each weight's int8 plan (None: float32).
Structs = tuple[tuple[c_layers.LinearC, ...], tuple[torch.Tensor, ...], tuple[tuple[str, ...] | None, ...]]
Layer = tuple[torch.Tensor, torch.Tensor | None, Int8Weight | None]  # weight, bias, int8 form or None


def structs(layers: tuple[Layer, ...]) -> Structs | None:
    """c_layers.c_linear's structs for (weight, bias, int8 form or None) layers, the tensors they point into, and each
    weight's plan (None for float32); None where a weight computes in neither C kernel (int8 without the VNNI
    kernel's packed form, float32 where f32_gemm's kernel does not give oneDNN's bits)."""
    forms: list[tuple[c_gemm.VnniWeight | c_gemm.F32Weight, tuple[str, ...] | None]] = []
    for w, _, q in layers:
        if q is not None:
            if q.vnni is None:
                return None
            forms.append((q.vnni, q.plan))
            continue
        f32 = f32_gemm.form(w) if w.dtype == torch.float32 and w.is_cpu else None
        if f32 is None:
            return None
        forms.append((f32, None))
    made = [
        c_layers.c_linear(f, None if b is None else b.detach().float().contiguous())
        for (f, _), (_, b, _) in zip(forms, layers, strict=True)
    ]
    return tuple(m[0] for m in made), tuple(t for m in made for t in m[1]), tuple(plan for _, plan in forms)


def serving(made: Structs | None, rows: int) -> tuple[c_layers.LinearC, ...] | None:
    """The structs, where every one's kernel serves `rows` rows."""
    if made is None:
        return None
    for struct, plan in zip(made[0], made[2], strict=True):
        if plan is None and rows > f32_gemm.most_rows(struct.N, struct.K):
            return None
        if plan is not None and kernel_at(plan, rows) != "vnni":
            return None  # another int8 kernel is faster at this row count
    return made[0]


def output_form(
    q: Int8Weight | None, weight: torch.Tensor, rows: int, plan: execution.Plan
) -> c_gemm.VnniWeight | c_gemm.F32Weight | None:
    """The output projection's form for the C call that ends a step with its log-softmax, at `rows` rows: int8 by the
    VNNI kernel where the plan scales back in C and the weight's plan takes VNNI at that count; float32 by f32_gemm's
    kernel where it serves; None elsewhere."""
    if q is not None:
        if q.vnni is not None and plan.int8_output_in_c and kernel_at(q.plan, rows) == "vnni":
            return q.vnni
        return None
    return f32_gemm.serving(weight, rows) if plan.onednn else None


def swish_fc1(
    weight: torch.Tensor, bias: torch.Tensor | None, rows: int
) -> tuple[c_layers.LinearC, tuple[torch.Tensor, ...], c_gemm.F32Weight] | None:
    """A float32 feed-forward's fc1 as a C struct where the C GEMM and c_gemm.f32_swish_ give oneDNN's linear with its
    swish post-op at `rows` rows (f32_gemm.swish_agrees at its shape): the struct, its tensors and the form."""
    if weight.dim() != 2 or f32_gemm.most_rows(*weight.shape) < rows or not f32_gemm.swish_agrees(*weight.shape):
        return None
    form = f32_gemm.form(weight)
    if form is None or (bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous())):
        return None
    fc1, tensors = c_layers.c_linear(form, None if bias is None else bias.detach())
    return fc1, tensors, form


def silu_exact_at(rows: int, width: int, plan: execution.Plan) -> bool:
    """Whether csrc/silu.c gives torch's SiLU bits on (rows, width) here: the plan has it exact, and ATen takes the
    tensor as one range of whole pairs of vectors at any width (fewer than native.SILU_RANGE elements or one
    intra-op thread; a multiple of native.SILU_PAIR)."""
    n = rows * width
    one_range = (torch.get_num_threads() == 1 or n < native.SILU_RANGE) and n % native.SILU_PAIR == 0
    return plan.silu_in_c and one_range
