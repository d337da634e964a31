"""Which kernels compute: chosen here, at the top of model/, and handed down, so that model/nn and model/decode
compute with what they are given and never ask what runs.

`execution_plan` is a loaded model's one plan (model/kernels/execution.py's Plan: the device, the compute type,
the C step or PyTorch's operators, and each GEMM shape's kernel by row count), built by Translator.load, handed
to the model (Seq2Seq.use_plan), and shown by `beamserve translate --verbose` and /v1/models.

`step_kernels("torch")` is the static step's PyTorch operators (slots.TORCH_STEP, every path's reference);
`step_kernels("triton")` computes the same attentions and constrained log-probabilities with the Triton
kernels of model/kernels/triton_step.py (on a GPU compiled; on CPU tensors only under Triton's interpreter,
for their tests). The GEMMs, LayerNorms and the beam step stay PyTorch's in both.
"""

from __future__ import annotations

import importlib.util
import os
from typing import cast

import torch

from model.decode.search import NEG, BeamState, SearchOptions, ban_repeated_ngrams
from model.decode.slots import TORCH_STEP, FusedKernels, RowOptions, SlotState, StepKernels
from model.kernels import execution, f32_gemm, int8_choice
from model.kernels.gemm import Linear
from model.kernels.quant import int8_of
from model.nn.blocks import DecoderLayer, EncoderLayer
from model.nn.transformer import Seq2Seq

STEP_KERNELS = ("torch", "triton")
STEP_ENV = "BEAMSERVE_STEP_KERNELS"  # the static decode step's kernels (STEP_KERNELS); default torch


def execution_plan(model: Seq2Seq, device: torch.device, compute_type: str) -> execution.Plan:
    """The plan `model` computes with on `device` in `compute_type`: this process's kernels (execution.probe) where
    the model runs on the CPU, PyTorch's operators elsewhere, each of its GEMM shapes' kernels, and the static
    decode step's kernels as STEP_ENV names them (checked here: ValueError for a set that cannot run)."""
    base = execution.probe() if device.type == "cpu" else execution.PYTORCH
    step = os.environ.get(STEP_ENV, "torch")
    if step not in STEP_KERNELS:
        raise ValueError(f"{STEP_ENV}={step!r}: one of {', '.join(STEP_KERNELS)}")
    if step == "triton":
        if importlib.util.find_spec("triton") is None:
            raise ValueError(f"{STEP_ENV}=triton: this environment has no triton (pip install triton)")
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(f"{STEP_ENV}=triton: Triton's kernels run on CUDA, or on CPU under TRITON_INTERPRET=1")
    gemms = _gemms(model, device, base)
    return base.with_(device=str(device), compute_type=compute_type, gemms=gemms, step_kernels=step)


def _gemms(model: Seq2Seq, device: torch.device, plan: execution.Plan) -> tuple[execution.Gemm, ...]:
    """Each weight shape's kernel, the first layer of each kind standing for the rest (every layer of a stack has
    its shapes). int8: the kernel int8_choice measured for each row count as the weights were quantised; float32:
    f32_gemm's C kernel up to its rows where it gives oneDNN's bits (which it checks at a shape's first use, in
    the thread that decodes: a check here, in the loading thread, would start a second OpenMP team), then
    oneDNN."""
    cfg = model.cfg
    layers: list[tuple[str, Linear]] = []
    for side, stack in (("encoder", list(model.encoder_layers)), ("decoder", model.decoders)):
        if stack:
            first = cast(EncoderLayer | DecoderLayer, stack[0])
            attention = first.self_attn.q_proj
            layers += [(f"{side} attention", attention), (f"{side} fc1", first.ffn.fc1), (f"{side} fc2", first.ffn.fc2)]
    found: list[execution.Gemm] = []
    for role, layer in layers:
        q = int8_of(layer)
        N, K = (layer.weight if q is None else q.qweight).shape
        found.append(execution.Gemm(role, N, K, _kernel(None if q is None else q.plan, N, K, device, plan)))
    q = model.output_int8()
    N, K = cfg.decoder_vocab_size, cfg.d_model
    found.append(execution.Gemm("output projection", N, K, _kernel(None if q is None else q.plan, N, K, device, plan)))
    return tuple(found)


def _kernel(int8: tuple[str, ...] | None, N: int, K: int, device: torch.device, plan: execution.Plan) -> str:
    """What multiplies an (N, K) weight: `int8` the int8 form's kernel for each row bucket (int8_choice), None for
    a float weight."""
    if device.type == "cuda":
        return "cuBLAS (F.linear)"
    if device.type != "cpu":
        return "F.linear"
    if int8 is not None:
        spans: list[tuple[int, str]] = []
        for i, kernel in enumerate(int8):
            if not spans or spans[-1][1] != kernel:  # a bucket's rows start past the last one's
                spans.append((min(r for r in range(1, 1024) if int8_choice.bucket(r) == i), kernel))
        return "int8 " + ", ".join(f"{k} from {rows} rows" if rows > 1 else k for rows, k in spans)
    if not plan.onednn:
        return "MKL (F.linear)"
    if plan.c and plan.f32_in_c:  # checked at the shape's first use: a check here would start a thread team
        return f"C up to {f32_gemm.most_rows(N, K)} rows where it gives oneDNN's bits here, oneDNN above"
    return "oneDNN"


def step_kernels(name: str) -> StepKernels:
    """The step's kernels by name (STEP_KERNELS); ValueError for another."""
    if name == "torch":
        return TORCH_STEP
    if name == "triton":
        from model.kernels import triton_step  # triton: a GPU's torch has it, the CPU serving install does not

        fused = FusedKernels(
            triton_step.embed,
            triton_step.add_layer_norm,
            triton_step.lineage_self_attention,
            triton_step.slot_cross_attention,
            _fused_log_probs,
            _advance,
        )
        return StepKernels("triton", _self_attention, triton_step.slot_cross_attention, _log_probs, fused)
    raise ValueError(f"step kernels {name!r}: one of {', '.join(STEP_KERNELS)}")


_SUPPRESSED: dict[tuple[torch.device, int, tuple[int, ...]], torch.Tensor] = {}


def _suppressed(device: torch.device, V: int, opts: SearchOptions) -> torch.Tensor:
    """(V,) bool: the ids never generated, made once (before a step is captured: its warm-up makes it)."""
    key = (device, V, opts.suppressed_token_ids)
    if key not in _SUPPRESSED:
        mask = torch.zeros(V, dtype=torch.bool, device=device)
        mask[list(opts.suppressed_token_ids)] = True
        _SUPPRESSED[key] = mask
    return _SUPPRESSED[key]


def _bans(
    N: int, V: int, history: torch.Tensor, pos: torch.Tensor, ngram: torch.Tensor, opts: SearchOptions
) -> torch.Tensor | None:
    """The n-gram bans as a mask (N, V), found as every search finds them; None where no slot may ask."""
    if not opts.no_repeat_ngram_size:
        return None
    bans = torch.zeros(N, V, device=history.device)
    ban_repeated_ngrams(bans, history, pos, ngram, opts.no_repeat_ngram_size)
    return bans.isinf()


def _log_probs(logits: torch.Tensor, rows: RowOptions, opts: SearchOptions) -> torch.Tensor:
    """slots.torch_log_probs in Triton's constrained log-softmax."""
    from model.kernels import triton_step

    N, V = logits.shape
    bans = _bans(N, V, rows.history, rows.pos, rows.ngram, opts)
    return triton_step.constrained_log_softmax(
        logits, rows.pos, rows.max_len, rows.min_len, rows.first_token, _suppressed(logits.device, V, opts),
        opts.eos_token_id, opts.forced_eos_token_id, bans,
    )[0]  # fmt: skip


def _self_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    rows_pos: torch.Tensor,
    self_mask: torch.Tensor,  # the kernel reads the positions itself
    t_len: int,
) -> torch.Tensor:
    """slots.torch_self_attention in Triton."""
    from model.kernels import triton_step

    return triton_step.slot_self_attention(q, k_new, v_new, k_cache, v_cache, rows_pos, t_len)


def _fused_log_probs(logits: torch.Tensor, state: SlotState, opts: SearchOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused step's constrained log-probabilities (each slot's options read for its beams) and block maxima."""
    from model.kernels import triton_step

    (N, V), K = logits.shape, state.beams
    bans = None
    if opts.no_repeat_ngram_size:  # found as every search finds them, each row by its slot's size
        history = state.search.run_tokens.view(N, state.search.width)
        bans = triton_step.ngram_bans(
            history, state.pos, state.ngram, state.bans, state.banned, opts.no_repeat_ngram_size
        )
    found, maxima = triton_step.constrained_log_softmax(
        logits, state.pos, state.max_len, state.min_len, state.first_token, _suppressed(logits.device, V, opts),
        opts.eos_token_id, opts.forced_eos_token_id, bans, beams=K, block_maxima=True,
    )  # fmt: skip
    assert maxima is not None
    return found, maxima


def _advance(
    log_probs: torch.Tensor, maxima: torch.Tensor, state: SlotState, norm: torch.Tensor, t_len: int, opts: SearchOptions
) -> None:
    """The fused step's beam step and bookkeeping (triton_step.slot_beam_step) over the state's tensors."""
    from model.kernels import triton_step

    triton_step.slot_beam_step(
        log_probs, maxima, tuple(getattr(state.search, f) for f in BeamState.FIELDS), state.pos, state.max_len, norm,
        state.early_stopping, state.active, state.finished, state.tokens, state.lineage, t_len, opts.eos_token_id, NEG,
    )  # fmt: skip
