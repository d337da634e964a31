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
from model.nn.transformer import Seq2Seq

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
    with monkeypatch.context() as patched:  # each count wraps the kernels themselves, and unwraps them after
        for name in triton_step.LAUNCHED:
            patched.setattr(triton_step, name, Launches(name, getattr(triton_step, name), counted))
        with counted:
            yield counted


def step_counts(
    model: Seq2Seq, monkeypatch: pytest.MonkeyPatch, kernels: str, sources: list[list[int]], ngram: int = 0
) -> Kernels:
    """One step of a full pool (every slot decoding, beam 4), the second one (the first makes what is made once:
    the fused weights, the suppressed ids' mask)."""
    from model import DecodeOptions
    from model.decode.slot_decoder import PoolShape, SlotDecoder
    from model.plan import step_kernels

    if DEVICE == "cpu":  # the GPU's path: PyTorch's operators, F.linear's GEMMs
        model.use_plan(execution.PYTORCH.with_(onednn=False))
        monkeypatch.setattr(onednn, "LINEAR", None)
    shape = PoolShape(slots=len(sources), beams=4, target_len=16, source_len=16, ngram_max=ngram)
    pool = SlotDecoder(model, shape, device=torch.device(DEVICE), kernels=step_kernels(kernels))
    with torch.inference_mode():
        opts = DecodeOptions(beam_size=4, no_repeat_ngram_size=ngram)
        pool.admit(sources, [opts] * len(sources), [12] * len(sources))
        pool.launch()
        with counting(monkeypatch) as counted:
            pool.launch()
    assert pool.state.active.all(), "every slot still decoding: a full step counted"
    return counted


def test_the_counter_counts_computing_operators_and_launches_not_views() -> None:
    counted = Kernels()
    x = torch.randn(4, 6)
    with counted:
        y = x.view(6, 4).t()  # views: nothing launched
        torch.empty(3)
        z = (y + 1).relu()
    assert counted.ops == {"add": 1, "relu": 1} and z.shape == (4, 6)


def test_a_step_of_the_fused_gpu_path_launches_at_most_twelve_kernels_a_layer_and_ten_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shipped en-de (3 + 3 layers, post-norm, swish): at most 60 a step, and 12 a decoder layer plus 10; the
    operators' step launches several times as many (what the fused set replaces)."""
    from model import Translator

    tr = Translator.load("en-de", DEVICE)
    sources = [tr.encode("A dog runs through the snow."), tr.encode("Two men play.")] * 2
    fused = step_counts(tr.model, monkeypatch, "triton", sources)
    layers = tr.model.cfg.decoder_layers
    assert fused.total <= 60 and fused.total <= 12 * layers + 10, fused.ops
    assert fused.ops["linear"] == 6 * layers + 1  # q k v as one GEMM, out, q, out, fc1, fc2 a layer; the logits
    assert all(fused.ops[f"triton {n}"] for n in triton_step.LAUNCHED if n != "_ngram_bans")  # each in the step
    operators = step_counts(tr.model, monkeypatch, "torch", sources)
    assert operators.total > 4 * fused.total, (operators.total, fused.total)
    banning = step_counts(tr.model, monkeypatch, "triton", sources, ngram=3)  # n-gram bans: one launch more
    assert banning.total == fused.total + 1 and banning.ops["triton _ngram_bans"] == 1, banning.ops


def test_a_pre_norm_model_s_fused_step_keeps_the_same_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """M2M100's and NLLB's layout (pre-norm, the final norm, ReLU), six decoder layers: 12 a layer plus 10."""
    from model.nn.config import ModelConfig

    cfg = ModelConfig(
        vocab_size=300, d_model=64, encoder_layers=1, decoder_layers=6, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64,
        normalize_before=True, activation="relu", pad_token_id=1, eos_token_id=2, decoder_start_token_id=2,
    )  # fmt: skip
    model = Seq2Seq(cfg).to(DEVICE).eval()
    counted = step_counts(model, monkeypatch, "triton", [[5, 6, 7, 2], [9, 2], [4, 4, 8, 9, 2]])
    assert counted.total <= 12 * 6 + 10, counted.ops
