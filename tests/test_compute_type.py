"""Compute types (model/kernels/compute_type.py, model/kernels/quant.py): int8 weights within half a quantisation step,
each layer's int8 output close to float32's, a sentence's translation independent of its batch,
translation quality per compute type on half the test set, and int8 checkpoints."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import sacrebleu
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from model import TranslationResult, Translator
from model.io import checkpoint
from model.kernels import compute_type as compute
from model.kernels.gemm import Linear
from model.kernels.int8_kernels import KERNELS, exact
from model.kernels.quant import int8_of, int8_weight, linear_int8, quantize_weight
from model.nn.layers import FeedForward, MultiHeadAttention
from model.nn.transformer import Seq2Seq
from model.shipped import PRETRAINED_DIR
from service.cli import main

from .conftest import bfloat16_rows_invariant, read_lines

CPU = torch.device("cpu")
MODELS = ("en-de", "en-fr")
TYPES = [t for t in ("float32", "int8", "bfloat16", "int8_bfloat16") if t in compute.supported(CPU)]
_loaded: dict[tuple[str, str], Translator] = {}


def load(model: str, compute_type: str) -> Translator:
    if (model, compute_type) not in _loaded:
        _loaded[model, compute_type] = Translator.load(model, "cpu", compute_type=compute_type)
    return _loaded[model, compute_type]


def test_int8_weights_are_within_half_a_step_and_each_layer_close_to_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    tr = load("en-de", "float32")
    inputs: dict[str, torch.Tensor] = {}

    def keep(name: str, x: torch.Tensor) -> None:
        inputs.setdefault(name, x.detach())

    hooks = []
    names = {m: name for name, m in tr.model.named_modules()}
    for name, m in tr.model.named_modules():
        if isinstance(m, Linear):
            hooks.append(m.register_forward_pre_hook(lambda mod, args, name=name: keep(name, args[0])))
        if isinstance(m, FeedForward):  # fc1 runs through gemm.linear with its activation, not its module
            hooks.append(m.register_forward_pre_hook(lambda mod, args, name=name: keep(f"{name}.fc1", args[0])))
    project_qkv = MultiHeadAttention.project_qkv

    def qkv(self: MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:  # the decoder step's one GEMM of three
        for part in ("q_proj", "k_proj", "v_proj"):
            keep(f"{names[self]}.{part}", x)
        return project_qkv(self, x)

    monkeypatch.setattr(MultiHeadAttention, "project_qkv", qkv)
    # Each linear layer called on its own (a decode step's sublayers in one C call would pass no hook)
    monkeypatch.setattr(MultiHeadAttention, "c_sublayer", lambda *a, **k: None)
    monkeypatch.setattr(FeedForward, "_c_linears", lambda *a, **k: None)
    monkeypatch.setattr(Seq2Seq, "_cross_kv", lambda *a: None)  # and the source keys layer by layer
    tr.translate(read_lines("test_2016_flickr.en.gz", 16), beam_size=4)
    for h in hooks:
        h.remove()
    modules = dict(tr.model.named_modules())
    assert len(inputs) == 3 * 6 + 3 * 10  # every linear layer of the encoder and the decoder ran
    for name, x in inputs.items():
        w, b = modules[name].weight.detach(), modules[name].bias
        q = quantize_weight(w)
        assert ((w - q.dequantize()).abs() <= q.scale[:, None] / 2 + 1e-7).all(), name
        with torch.inference_mode():
            ref = F.linear(x, w, b)
            err = (linear_int8(x, q, b) - ref).norm() / ref.norm()
        assert err < 0.05, f"{name}: relative error {err:.4f}"  # symmetric int8, outlier channels: up to 3.5%


SET = 500  # the test set's first sentences that the equivalence and quality tests translate

# On the test set bfloat16's scores alone and batched stay this close where its GEMM rounds by row count.
BF16_SCORES = 0.01


# Every compute type: a sentence alone and in a batch of 64 gets the same tokens and the same scores, to
# the bit (oneDNN's GEMMs compute a row alike beside any rows, in float32 and int8, and in bfloat16 on CPUs
# without AMX; attention sums in the same order however far the batch pads the source: model/kernels/gemm.py,
# model/kernels/quant.py, layers.softmax_, layers.step_attention). bfloat16 on CPUs with AMX: the same tokens,
# scores within BF16_SCORES.
@functools.cache
def in_batches_of_64(
    model: str, compute_type: str, beam_size: int = 4, count: int | None = None
) -> list[TranslationResult]:
    """Translations of the test set (its first `count` sentences), 64 to a batch; shared with the quality test."""
    return load(model, compute_type).translate(
        read_lines("test_2016_flickr.en.gz", count), beam_size=beam_size, max_batch_size=64
    )


# Every tenth of the first 500 sentences decoded alone (each in its batch of 64 from those 500, as the
# quality test decodes them): 50 sentences of every length per model in the CPU's production types
# (float32, int8), 25 in the bfloat16 ones.
@pytest.mark.parametrize(
    ("model", "compute_type", "beam_size", "count", "every"),
    [(m, t, 4, SET, 20 if "bfloat16" in t else 10) for m in MODELS for t in TYPES]
    + [("en-de", "float32", 1, 128, 1), ("en-de", "int8", 1, 128, 1)],
)
def test_test_sentences_translate_alone_as_in_a_batch_of_64(
    model: str, compute_type: str, beam_size: int, count: int | None, every: int
) -> None:
    tr = load(model, compute_type)
    texts = read_lines("test_2016_flickr.en.gz", count)[::every]
    exact = compute_type != "bfloat16" or bfloat16_rows_invariant()
    in_batches = in_batches_of_64(model, compute_type, beam_size, count)[::every]
    for text, batched in zip(texts, in_batches, strict=True):
        [alone] = tr.translate([text], beam_size=beam_size)
        if exact:
            assert (alone.token_ids, alone.scores) == (batched.token_ids, batched.scores), text
        else:  # AMX's and AVX512-BF16's kernels round apart (conftest.bfloat16_rows_invariant)
            assert alone.token_ids == batched.token_ids, text
            assert alone.scores == pytest.approx(batched.scores, abs=BF16_SCORES), text


def test_the_int8_encoder_gives_a_sentence_the_same_states_alone_and_padded_in_a_batch() -> None:
    tr = load("en-de", "int8")
    pad = tr.model.cfg.pad_token_id
    short, long = (tr.encode(t) for t in ("A dog runs.", "Two young men in red shirts are playing soccer on a field."))
    with torch.inference_mode():
        alone = tr.model.encode(torch.tensor([short]), torch.tensor([short]) != pad)
        padded = torch.tensor([short + [pad] * (len(long) - len(short)), long])
        batched = tr.model.encode(padded, padded != pad)
    assert torch.equal(alone[0], batched[0, : len(short)])


@pytest.mark.parametrize(("k", "n"), [(256, 256), (256, 1024), (512, 2048), (256, 8000)])
def test_an_int8_product_row_is_exactly_the_same_in_any_batch(k: int, n: int) -> None:
    torch.manual_seed(k + n)
    x, w, b = torch.randn(300, k), torch.randn(n, k) * 0.05, torch.randn(n)
    q = quantize_weight(w)
    with torch.inference_mode():
        alone = linear_int8(x[:1], q, b)
        # Beside rows 100x larger: a per-tensor activation scale would crush the first row's resolution.
        beside = linear_int8(torch.cat([x[:1], 100 * x[1:8]]), q, b)[:1]
        assert torch.equal(alone, beside)
        # Each row count may take another kernel (model/kernels/int8_choice.py): the same bits.
        for rows in (2, 4, 13, 64, 128, 300):
            assert torch.equal(linear_int8(x[:rows], q, b)[:1], alone), rows


def _reference_kernel() -> str:
    return "int_mm" if exact("int_mm") else "c"


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_exact_int8_kernel_gives_the_same_bits(kernel: str) -> None:
    if not exact(kernel):
        pytest.skip(f"the {kernel} int8 kernel does not run here, or not exactly (model/kernels/int8_kernels.py)")
    torch.manual_seed(1)
    w, b = torch.randn(2051, 520) * 0.05, torch.randn(2051)  # neither a whole panel of columns nor a group of 4
    plain = quantize_weight(w)
    # torch._int_mm's product is the reference where exact (not where oneDNN is held to AVX2: ONEDNN_MAX_CPU_ISA)
    ours, reference = (int8_weight(plain.qweight, plain.scale, (k,)) for k in (kernel, _reference_kernel()))
    with torch.inference_mode():
        for rows in (1, 3, 16, 64, 130):
            x = torch.randn(rows, 520)
            for bias in (b, None):
                assert torch.equal(linear_int8(x, ours, bias), linear_int8(x, reference, bias)), (rows, bias is None)
            assert torch.equal(
                linear_int8(x, ours, b, log_softmax=True), linear_int8(x, reference, b, log_softmax=True)
            ), rows


@pytest.mark.parametrize("model", MODELS)
def test_quality_of_every_compute_type_on_the_test_set(model: str) -> None:
    refs = read_lines(f"test_2016_flickr.{model.split('-')[1]}.gz", SET)
    scores = {}
    for compute_type in TYPES:
        hyps = [r.hypotheses[0] for r in in_batches_of_64(model, compute_type, 4, SET)]  # the cached call's key
        scores[compute_type] = (sacrebleu.corpus_bleu(hyps, [refs]).score, sacrebleu.corpus_chrf(hyps, [refs]).score)
    print(model, {t: f"BLEU {b:.2f} chrF {c:.2f}" for t, (b, c) in scores.items()})
    bleu32, chrf32 = scores["float32"]
    assert bleu32 > 35  # the model cards: 41.0 (en-de), 40.0 (en-fr)
    for compute_type, (bleu, chrf) in scores.items():
        assert bleu >= bleu32 - (0.5 if compute_type == "int8" else 1.0), (compute_type, bleu, bleu32)
        assert chrf >= chrf32 - 1.0, (compute_type, chrf, chrf32)


def test_compute_types_the_device_cannot_run_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'int8' is not supported on cuda; supported: default, float32, float16"):
        compute.resolve("int8", torch.device("cuda"))
    with pytest.raises(ValueError, match=r"float16' is not supported on this CPU.*supported: default, float32, int8"):
        compute.resolve("float16", CPU)
    with pytest.raises(ValueError, match="compute_type must be one of default, float32"):
        compute.resolve("int4", CPU)
    with pytest.raises(ValueError, match="dtype or compute_type"):
        Translator.load("en-de", "cpu", dtype="float32", compute_type="int8")


def test_the_digest_tells_compute_types_apart() -> None:
    assert load("en-de", "int8").digest != load("en-de", "float32").digest
    assert load("en-de", "int8").compute_type == "int8" and load("en-de", "float32").compute_type == "float32"
    assert compute.resolve("default", CPU).name == "float32"


def test_an_int8_checkpoint_translates_to_the_same_bits_as_quantising_at_load(tmp_path: Path) -> None:
    quantised = load("en-de", "int8")
    assert main(["quantize", "--model", "en-de", "--out", str(tmp_path / "q")]) == 0
    assert checkpoint.quantization(tmp_path / "q") == "int8"
    saved = Translator.load(tmp_path / "q", "cpu")  # default on CPU: the type it was saved in
    assert saved.compute_type == "int8"
    assert saved.digest == quantised.digest  # equal digests: a translation cache serves both
    texts = read_lines("test_2016_flickr.en.gz", 64)
    for a, b in zip(quantised.translate(texts, beam_size=4), saved.translate(texts, beam_size=4), strict=True):
        assert (a.token_ids, a.scores) == (b.token_ids, b.scores)
    # Nothing was quantised at load: the GEMMs read the int8 rows as saved.
    stored = load_file(str(tmp_path / "q" / "model.safetensors"))
    fc1 = saved.model.decoder_layers[0].ffn.fc1
    assert torch.equal(int8_of(fc1).qweight, stored["decoder_layers.0.ffn.fc1.weight"])  # type: ignore[union-attr]
    assert stored["decoder_layers.0.ffn.fc1.weight"].dtype == torch.int8
    assert (tmp_path / "q" / "model.safetensors").stat().st_size < 0.8 * (
        PRETRAINED_DIR / "en-de" / "model.safetensors"
    ).stat().st_size


def test_an_int8_checkpoint_loads_as_float_with_its_weights_dequantised(tmp_path: Path) -> None:
    checkpoint.save_int8(load("en-de", "float32").model, tmp_path, PRETRAINED_DIR / "en-de")
    as_float = Translator.load(tmp_path, "cpu", compute_type="float32")
    assert as_float.compute_type == "float32"
    q = quantize_weight(load("en-de", "float32").model.encoder_layers[0].ffn.fc2.weight)
    assert torch.equal(as_float.model.encoder_layers[0].ffn.fc2.weight, q.dequantize())
    [result] = as_float.translate(["A dog runs on the beach."], beam_size=4)
    assert result.hypotheses[0].startswith("Ein Hund")


def test_an_int8_model_holds_no_float_copy_of_its_int8_weights_and_translates_as_with_one(tmp_path: Path) -> None:
    """Translator.load frees the float form of each weight that computes in int8: the same bits as the
    same model quantised with its float weights kept. The tied embedding table stays float."""
    int8 = load("en-de", "int8")
    fc1 = int8.model.decoder_layers[0].ffn.fc1
    assert fc1.weight.numel() == 0 and int8_of(fc1) is not None and int8.model.embed.weight.numel() > 0
    kept = checkpoint.build(PRETRAINED_DIR / "en-de")
    compute.quantize_int8(kept, kept.output_weight)
    assert kept.decoder_layers[0].ffn.fc1.weight.numel() > 0
    reference = Translator(kept, int8.tokenizer, device=CPU)
    texts = read_lines("test_2016_flickr.en.gz", 32)
    for a, b in zip(int8.translate(texts, beam_size=4), reference.translate(texts, beam_size=4), strict=True):
        assert (a.token_ids, a.scores) == (b.token_ids, b.scores)
    with pytest.raises(ValueError, match="save_int8"):
        checkpoint.save(int8.model, tmp_path, None)


def test_an_int8_form_is_its_layers_module_with_buffers_in_no_state_dict() -> None:
    """Two models in one process (a pool replica) keep their own int8 forms: each a module of its layer, its
    tensors buffers of that layer (listed, moved and freed with it) and never in a state dict."""
    from model.kernels.quant import INT8_SLOT, Int8Weight, use_int8

    layer, other = Linear(64, 64), Linear(64, 64)
    keys = set(layer.state_dict())
    q = use_int8(layer, layer.weight)
    assert int8_of(layer) is q and isinstance(q, Int8Weight) and int8_of(other) is None
    assert dict(layer.named_modules())[INT8_SLOT] is q
    buffers = dict(layer.named_buffers())
    assert buffers[f"{INT8_SLOT}.qweight"] is q.qweight and buffers[f"{INT8_SLOT}.scale"] is q.scale
    assert q.qweight.dtype == torch.int8 and q.qweight.shape == (64, 64)
    if q.vnni is not None:  # the packed form the VNNI kernel reads is the layer's too
        assert buffers[f"{INT8_SLOT}.vnni_packed"] is q.vnni.packed
    assert set(layer.state_dict()) == keys
    x = torch.randn(3, 64)
    with torch.inference_mode():
        assert torch.equal(layer(x), linear_int8(x, q, layer.bias))  # the layer computes in int8
        assert not torch.equal(other(x), linear_int8(x, quantize_weight(other.weight), other.bias))
    assert use_int8(layer, layer.weight) is q  # quantised once
    q._apply(torch.clone)  # new buffers (as .to() to another device would make): what the kernels read follows
    assert q.qweight is q._buffers["qweight"] and q.scale is q._buffers["scale"]
    assert q.vnni is None or (q.vnni.packed is q._buffers["vnni_packed"] and q.vnni.scale is q.scale)
