"""How many device kernels one step of the GPU's static decode path launches, counted on CPU: every PyTorch
operator that computes (a dispatch-mode counter: views and allocations launch nothing), every Triton launch
(model/kernels/triton_step.py's kernels, wrapped), and the GEMMs as the GPU calls them (F.linear, cuBLAS's
addmm with its bias), the CPU's oneDNN and C GEMMs set aside."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are decorated, at their module's import

from model.kernels import execution, onednn, triton_step

pytestmark = pytest.mark.triton
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Operators that compute nothing on the device: allocations and metadata (views are told by their schema).
NO_KERNEL = {"empty", "empty_like", "empty_strided", "new_empty", "lift_fresh", "detach", "alias", "_unsafe_view"}


class Kernels(TorchDispatchMode):
    """The operators and Triton launches inside it, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.paused = False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        if not self.paused and not func.is_view and name not in NO_KERNEL:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())


class Launches:
    """A Triton kernel whose launches `counted` counts (the interpreter's own operators not among them)."""

    def __init__(self, name: str, kernel: Any, counted: Kernels) -> None:
        self.name, self.kernel, self.counted = name, kernel, counted

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        launch = self.kernel[grid]

        def run(*args: Any, **kwargs: Any) -> Any:
            self.counted.ops[f"triton {self.name}"] += 1
            self.counted.paused = True
            try:
                return launch(*args, **kwargs)
            finally:
                self.counted.paused = False

        return run


@contextmanager
def counting(monkeypatch: pytest.MonkeyPatch) -> Iterator[Kernels]:
    counted = Kernels()
    for name in triton_step.LAUNCHED:
        monkeypatch.setattr(triton_step, name, Launches(name, getattr(triton_step, name), counted))
    with counted:
        yield counted


def step_counts(model_name: str, monkeypatch: pytest.MonkeyPatch, kernels: str) -> Kernels:
    """One step of a full pool (every slot decoding, beam 4) on the shipped model, the second one (the first
    makes what is made once: fused weights, masks)."""
    from model import DecodeOptions, Translator
    from model.decode.slot_decoder import PoolShape, SlotDecoder
    from model.plan import step_kernels

    tr = Translator.load(model_name, DEVICE)
    if DEVICE == "cpu":  # the GPU's path: PyTorch's operators, F.linear's GEMMs
        tr.model.use_plan(execution.PYTORCH.with_(onednn=False))
        monkeypatch.setattr(onednn, "LINEAR", None)
    shape = PoolShape(slots=4, beams=4, target_len=16, source_len=16, ngram_max=0)
    pool = SlotDecoder(tr.model, shape, device=torch.device(DEVICE), kernels=step_kernels(kernels))
    with torch.inference_mode():
        pool.admit([tr.encode("A dog runs.")] * 4, [DecodeOptions(beam_size=4)] * 4, [12] * 4)
        pool.launch()
        t_len, p_len = pool.bucket()
        with counting(monkeypatch) as counted:
            pool._run(tr.model, pool.state, pool.opts, t_len, p_len)
    return counted


@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_count(kernels: str, monkeypatch: pytest.MonkeyPatch) -> None:
    counted = step_counts("en-de", monkeypatch, kernels)
    print(kernels, counted.total, sorted(counted.ops.items(), key=lambda kv: -kv[1]))
