"""Marian's own release format (model/io/marian_release.py): a release written with Marian's parameter names
from a MarianMTModel converts back to that model's every tensor, and translates as CTranslate2's own
converter of Marian releases (ctranslate2.converters.OpusMTConverter) reads the same files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from model import Translator
from model.decode.decoding import pad_batch
from model.io import checkpoint
from model.io.marian_release import CONFIG_KEY, convert

transformers = pytest.importorskip("transformers")
ctranslate2 = pytest.importorskip("ctranslate2")

# CTranslate2's float32 log-probabilities on the tiny model lie up to 2e-3 from Hugging Face's on the same
# converted weights (beamserve's lie within 1e-5 of Hugging Face's): its own kernels' numerics.
TOLERANCE = 5e-3
HF_ATTENTION = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "out_proj": "o"}


def write_release(hf_dir: Path, out: Path) -> None:
    """A Marian release of the MarianMTModel in hf_dir: each parameter under Marian's name (matrices as
    Marian multiplies them, x @ W; vectors as (1, n) rows), the architecture as YAML in the npz, the
    vocabulary as Marian's .vocab.yml (no <pad>: Marian has none), decoder.yml, and the two spm files."""
    model = transformers.MarianMTModel.from_pretrained(hf_dir)
    cfg = model.config
    hf = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    pad = cfg.pad_token_id
    weights: dict[str, np.ndarray] = {
        "Wemb": hf["model.shared.weight"][:pad],
        "decoder_ff_logit_out_b": hf["final_logits_bias"][:, :pad],
    }

    def put(marian: str, hf_name: str) -> None:
        value = hf[hf_name]
        weights[marian] = value.T if value.ndim == 2 else value[None, :]

    for side, depth in (("encoder", cfg.encoder_layers), ("decoder", cfg.decoder_layers)):
        blocks = [("self", "self_attn", "self_attn_layer_norm")]
        if side == "decoder":
            blocks.append(("context", "encoder_attn", "encoder_attn_layer_norm"))
        for i in range(depth):
            m, h = f"{side}_l{i + 1}_", f"model.{side}.layers.{i}."
            for block, module, norm in blocks:
                for proj, letter in HF_ATTENTION.items():
                    put(f"{m}{block}_W{letter}", f"{h}{module}.{proj}.weight")
                    put(f"{m}{block}_b{letter}", f"{h}{module}.{proj}.bias")
                put(f"{m}{block}_Wo_ln_scale", f"{h}{norm}.weight")
                put(f"{m}{block}_Wo_ln_bias", f"{h}{norm}.bias")
            for n in (1, 2):
                put(f"{m}ffn_W{n}", f"{h}fc{n}.weight")
                put(f"{m}ffn_b{n}", f"{h}fc{n}.bias")
            put(f"{m}ffn_ffn_ln_scale", f"{h}final_layer_norm.weight")
            put(f"{m}ffn_ffn_ln_bias", f"{h}final_layer_norm.bias")
    marian_config = {
        "type": "transformer",
        "dim-emb": cfg.d_model,
        "enc-depth": cfg.encoder_layers,
        "dec-depth": cfg.decoder_layers,
        "transformer-heads": cfg.encoder_attention_heads,
        "transformer-dim-ffn": cfg.encoder_ffn_dim,
        "transformer-ffn-activation": cfg.activation_function,
        "transformer-preprocess": "",
        "transformer-postprocess": "dan",
        "transformer-postprocess-emb": "d",
        "transformer-decoder-autoreg": "self-attention",
        "transformer-no-projection": False,
        "transformer-guided-alignment-layer": "last",
        "tied-embeddings-all": True,
    }
    text = yaml.safe_dump(marian_config).encode() + b"\0"
    weights[CONFIG_KEY] = np.frombuffer(text, dtype=np.int8)
    out.mkdir(parents=True)
    np.savez(out / "opus.spm-spm.transformer.model1.npz.best-perplexity.npz", **weights)
    vocab = {p: i for p, i in json.loads((hf_dir / "vocab.json").read_text(encoding="utf-8")).items() if i != pad}
    (out / "opus.spm-spm.vocab.yml").write_text(yaml.safe_dump(vocab, allow_unicode=True), encoding="utf-8")
    decoder = {
        "models": ["opus.spm-spm.transformer.model1.npz.best-perplexity.npz"],
        "vocabs": ["opus.spm-spm.vocab.yml", "opus.spm-spm.vocab.yml"],
        "beam-size": 4,
    }
    (out / "decoder.yml").write_text(yaml.safe_dump(decoder))
    for name in ("source.spm", "target.spm"):
        shutil.copyfile(hf_dir / name, out / name)


@pytest.fixture(scope="module")
def release(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the MarianMTModel directory, its Marian release)."""
    base = tmp_path_factory.mktemp("release")
    checkpoint.export_hf(tiny_dir, base / "hf")
    write_release(base / "hf", base / "release")
    return base / "hf", base / "release"


def test_conversion_gives_the_model_s_every_tensor(release: tuple[Path, Path], tmp_path: Path) -> None:
    hf_dir, release_dir = release
    convert(release_dir, tmp_path / "out")
    model = transformers.MarianMTModel.from_pretrained(hf_dir)
    original = model.state_dict()
    converted = transformers.MarianMTModel.from_pretrained(tmp_path / "out").state_dict()
    assert original.keys() == converted.keys()
    # Marian has no <pad>: its embedding row and logits bias are 0 after conversion (the decoder starts on a
    # zero embedding, as Marian's does). The tiny model trained here moved both through the tied projection.
    pad = model.config.pad_token_id
    assert not converted["model.shared.weight"][pad].any() and float(converted["final_logits_bias"][0, pad]) == 0
    for name in ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"):
        if name in original:
            original[name][pad] = 0.0
    original["final_logits_bias"][0, pad] = 0.0
    for name, tensor in original.items():
        assert torch.equal(converted[name], tensor), name
    assert json.loads((tmp_path / "out" / "vocab.json").read_text()) == json.loads((hf_dir / "vocab.json").read_text())


def test_the_converted_model_translates_as_ctranslate2_reads_the_release(
    release: tuple[Path, Path], tmp_path: Path, sources: list[str]
) -> None:
    _, release_dir = release
    convert(release_dir, tmp_path / "ours")
    ours = Translator.load(tmp_path / "ours", "cpu")
    ctranslate2.converters.OpusMTConverter(str(release_dir)).convert(str(tmp_path / "ct2"))
    ct2 = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    pieces = [ours.tokenizer.source.encode(s, out_type=str) for s in sources]
    mine = ours.translate(sources, beam_size=4, max_decoding_length=40, max_length_ratio=None)
    vocab = ours.tokenizer.pieces
    # Each best translation scored token by token (</s> included) by both: the same log-probabilities.
    targets = [[vocab[t] for t in r.token_ids[0]] for r in mine]
    theirs = ct2.score_batch(pieces, targets)
    cfg = ours.model.cfg
    src, mask = pad_batch([ours.encode(s) for s in sources], cfg.pad_token_id, torch.device("cpu"))
    for i, r in enumerate(mine):
        labels = torch.tensor([*r.token_ids[0], cfg.eos_token_id])
        dec = torch.cat([torch.tensor([cfg.decoder_start_token_id]), labels[:-1]])[None]
        with torch.inference_mode():
            logits = ours.model(src[i : i + 1], mask[i : i + 1], dec)[0]
        log_probs = torch.log_softmax(logits, -1).gather(1, labels[:, None])[:, 0]
        assert log_probs.tolist() == pytest.approx(theirs[i].log_probs, abs=TOLERANCE)
    # And CTranslate2's beam search finds the same best translation wherever it ends before the limit
    # (at the limit beamserve forces </s>, as Hugging Face does; CTranslate2 stops without it).
    found = ct2.translate_batch(pieces, beam_size=4, max_decoding_length=40)
    ended = [i for i, f in enumerate(found) if len(f.hypotheses[0]) < 39 and len(targets[i]) < 39]
    assert ended and all(found[i].hypotheses[0] == targets[i] for i in ended)


def test_a_vocabulary_keeps_every_piece_as_written(tmp_path: Path) -> None:
    """Pieces that YAML's default schema would read as a boolean, a null or a number stay strings."""
    from model.io.marian_release import read_vocab

    text = '</s>: 0\n<unk>: 1\nno: 2\nnull: 3\n1: 4\n"\\"": 5\n"a: b": 6\n\u2581the: 7\n'
    (tmp_path / "v.yml").write_text(text, encoding="utf-8")
    assert read_vocab(tmp_path / "v.yml") == {
        "</s>": 0, "<unk>": 1, "no": 2, "null": 3, "1": 4, '"': 5, "a: b": 6, "\u2581the": 7, "<pad>": 8,
    }  # fmt: skip


def test_the_cli_converts_and_unsupported_set_ups_are_refused_by_name(
    release: tuple[Path, Path], tmp_path: Path
) -> None:
    _, release_dir = release
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "service.cli",
            "convert-marian",
            "--release",
            str(release_dir),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "out" / "model.safetensors").is_file()
    weights = dict(np.load(next(release_dir.glob("*.npz"))))
    text = bytes(weights[CONFIG_KEY]).rstrip(b"\0").decode()
    pre_norm = text.replace("transformer-preprocess: ''", "transformer-preprocess: n")
    weights[CONFIG_KEY] = np.frombuffer(pre_norm.encode() + b"\0", np.int8)
    bad = tmp_path / "bad"
    shutil.copytree(release_dir, bad)
    np.savez(next(bad.glob("*.npz")), **weights)
    with pytest.raises(ValueError, match="pre-norm"):
        convert(bad, tmp_path / "never")


def test_a_release_is_converted_whole_or_refused_in_one_line_naming_what(
    release: tuple[Path, Path], tmp_path: Path
) -> None:
    """A tensor the conversion cannot place, a tensor missing, a file missing, a model.yml or decoder.yml that
    is not what it should be: exit 2, one line saying which, nothing written."""
    _, release_dir = release
    weights = dict(np.load(next(release_dir.glob("*.npz"))))

    def broken(name: str, tensors: dict[str, np.ndarray] | None = None, drop: str | None = None) -> Path:
        out = tmp_path / name
        shutil.copytree(release_dir, out)
        if tensors is not None:
            np.savez(next(out.glob("*.npz")), **tensors)
        if drop is not None:
            (out / drop).unlink()
        return out

    cases = {
        "extra": (broken("extra", {**weights, "encoder_l1_self_Wq_extra": np.zeros(3, np.float32)}), "cannot place"),
        "missing": (broken("missing", {k: v for k, v in weights.items() if k != "decoder_l1_ffn_W2"}), "ffn_W2"),
        "no spm": (broken("nospm", drop="target.spm"), "target.spm"),
        "no decoder.yml": (broken("nodecoder", drop="decoder.yml"), "decoder.yml"),
    }
    bad_yml = broken("badyml")
    (bad_yml / "decoder.yml").write_text("models: [")
    cases["bad decoder.yml"] = (bad_yml, "decoder.yml")
    for what, (path, needle) in cases.items():
        run = subprocess.run(
            [sys.executable, "-m", "service.cli", "convert-marian", "--release", str(path), "--out", f"{tmp_path}/o"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 2 and len(lines) == 1 and needle in lines[0], (what, run.stderr[-1500:])
        assert not (tmp_path / "o" / "model.safetensors").exists(), what
