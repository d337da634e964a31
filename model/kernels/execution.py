"""The execution plan: which kernels compute a model's inference, decided once and handed down.

`probe()` asks the library (model/kernels/native.py) once what it computes here and with PyTorch's bits; model/
plan.py adds the compute type and each GEMM shape's kernel where a Translator loads; Seq2Seq.use_plan hands the
plan to every layer and cache. model/nn and model/decode read its fields and never ask the library themselves,
so a test or a measurement that wants PyTorch's operators gives a model `PYTORCH` instead of turning kernels off.

What a tensor is still decides per call (`takes`): the C kernels compute CPU float32 tensors outside autograd,
and a CPU model's plan also serves its training and its GPU-free tests in PyTorch where a tensor is not that.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from model.kernels import c_attention, native, onednn


@dataclass(frozen=True)
class Gemm:
    """One weight shape's GEMM: what multiplies it at which row counts, for a person (`Plan.describe`)."""

    role: str  # "output projection", "feed-forward fc1", ...
    N: int
    K: int
    kernel: str  # "int8 vnni at 1-16 rows, int_mm from 64", "C up to 256 rows, then oneDNN", ...


@dataclass(frozen=True)
class Plan:
    """Which kernels compute: the library's decode-step kernels or PyTorch's operators, and with which parts."""

    c: bool = False  # the library's attention, sublayers, beam step and cache copies, on the tensors it takes
    layer_norm_in_c: bool = False  # csrc/layer_norm.c gives ATen's bits: whole layers as one library call
    silu_in_c: bool = False  # csrc/silu.c gives ATen's bits: a swish feed-forward inside that call too
    int8_output_in_c: bool = False  # the packed int8 output projection with its scale-back and log-softmax in C
    onednn: bool = False  # oneDNN's float32 matmul (model/kernels/onednn.py)
    f32_in_c: bool = False  # the C float32 GEMM is built (csrc/f32_gemm.c): a shape where it gives oneDNN's bits
    one_call: bool = True  # a decode step's layers as one library call where they take it (False: segments)
    steps_in_c: bool = True  # a beam search's steps, while every sentence goes on, as one call (beam_steps)
    step_kernels: str = (
        "torch"  # the static decode step's attentions and log-probs: "torch" or "triton" (model/plan.py)
    )
    kernels: str = "PyTorch's operators"  # what computes, for a person (native.in_use)
    device: str = "cpu"
    compute_type: str = "float32"
    gemms: tuple[Gemm, ...] = ()  # filled where a model loads (model/plan.py)

    def takes(self, x: torch.Tensor) -> bool:
        """Whether the library's kernels compute x: the plan has them and x is a CPU float32 tensor."""
        return self.c and x.dtype == torch.float32 and x.device.type == "cpu"

    def attends(self, x: torch.Tensor, head_dim: int) -> bool:
        """Whether a decode step's attention over x's device and dtype, with heads of `head_dim`, runs in C:
        the tensor taken, heads the kernel holds, outside autograd."""
        return self.takes(x) and head_dim <= c_attention.MOST_HEAD_DIM and not torch.is_grad_enabled()

    def with_(self, **changes: object) -> Plan:
        """This plan with `changes` (dataclasses.replace): one part turned off to measure it, a model's GEMMs."""
        return replace(self, **changes)  # type: ignore[arg-type]

    @property
    def step(self) -> str:
        """How a CPU decode step runs: "c (one call)"; "c (segments)", a call between each two activations (one_call
        off); "c (sublayers)", a call a sublayer with ATen's norms between (LayerNorm in C not ATen's bits); or
        "pytorch"."""
        if not self.c:
            return "pytorch"
        if not self.layer_norm_in_c:
            return "c (sublayers)"
        return "c (one call)" if self.one_call else "c (segments)"

    def describe(self) -> dict[str, object]:
        """The plan as /v1/models and `beamserve translate --verbose` show it."""
        return {
            "device": self.device,
            "compute_type": self.compute_type,
            "kernels": self.kernels,
            "step": self.step,
            "static_step": self.step_kernels,
            "int8_output_in_c": self.int8_output_in_c,
            "gemms": [{"role": g.role, "shape": [g.N, g.K], "kernel": g.kernel} for g in self.gemms],
        }

    def lines(self) -> list[str]:
        """describe() as lines of text."""
        head = f"{self.device}, {self.compute_type}, {self.kernels}; decode step {self.step}"
        head += f"; the static step's kernels {self.step_kernels}"
        return [head, *(f"  {g.role} ({g.N} x {g.K}): {g.kernel}" for g in self.gemms)]


PYTORCH = Plan(onednn=onednn.LINEAR is not None)  # PyTorch's operators (oneDNN's matmul among them) alone


def probe() -> Plan:
    """What this process computes with, which a layer or a cache is built with until it is handed a model's plan
    (Seq2Seq.use_plan): the library's kernels where it is built and loaded (and not turned off),
    each part where it gives PyTorch's bits here (each compared once, then remembered by the library). On the
    CPU whatever device a caller builds on (a model built on the meta device asks too)."""
    if not native.built():
        return replace(PYTORCH, kernels=native.in_use())
    with torch.device("cpu"):
        return Plan(
            c=True,
            layer_norm_in_c=native.layer_norms_exactly(),
            silu_in_c=native.silu_exactly(),
            int8_output_in_c=native.vnni() and native.scales_back(),
            onednn=onednn.LINEAR is not None,
            f32_in_c=native.f32(),
            kernels=native.in_use(),
        )
