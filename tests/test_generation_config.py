"""A model's generation_config.json as its decoding defaults, as transformers' `generate` takes them: a Marian model
saved by transformers with a generation config of its own translates, with no option given, as `generate` does
with none; an option given still wins; what beamserve does not apply is said at load."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from model import DecodeOptions, Translator
from model.io import generation

from .test_marian_layouts import save_marian, small_config

transformers = pytest.importorskip("transformers")

CONFIG = {  # generate's names, none of them beamserve's defaults
    "num_beams": 3,
    "num_return_sequences": 2,
    "max_length": 14,  # 13 generated tokens: the start token is one of generate's
    "min_length": 5,
    "length_penalty": 0.7,
    "no_repeat_ngram_size": 2,
    "early_stopping": True,
}


def test_generate_s_names_become_beamserve_s_options() -> None:
    found = generation.parse({**CONFIG, "bos_token_id": 0, "temperature": 0.5, "repetition_penalty": 1.0})
    assert found.options == {
        "beam_size": 3,
        "num_hypotheses": 2,
        "max_decoding_length": 13,
        "min_decoding_length": 4,
        "length_penalty": 0.7,
        "no_repeat_ngram_size": 2,
        "early_stopping": True,
    }
    assert found.ignored == ()  # the model's tokens, sampling's knobs without sampling, neutral values
    assert generation.parse({"max_length": 50, "max_new_tokens": 9}).options == {"max_decoding_length": 9}
    assert generation.parse({"min_length": 9, "min_new_tokens": 2}).options == {"min_decoding_length": 2}
    unapplied = generation.parse({"do_sample": True, "top_k": 5, "repetition_penalty": 1.3, "early_stopping": "never"})
    assert unapplied.ignored == ("do_sample", "top_k", "repetition_penalty", "early_stopping")
    with pytest.raises(ValueError, match=r"generation_config\.json: num_hypotheses"):
        generation.parse({"num_beams": 2, "num_return_sequences": 3}).defaults()


@pytest.fixture(scope="module")
def configured(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Marian model saved by transformers, its generation config CONFIG."""
    vocab = json.loads((tiny_dir / "vocab.json").read_text(encoding="utf-8"))
    pad = vocab["<pad>"]
    config = small_config(vocab_size=len(vocab), pad_token_id=pad, decoder_start_token_id=pad)
    out = save_marian(config, tmp_path_factory.mktemp("configured"), tiny_dir, vocab)
    saved = json.loads((out / generation.FILE).read_text())
    (out / generation.FILE).write_text(json.dumps({**saved, **CONFIG}))
    return out


def _generate(path: Path, sources: list[str], **options: Any) -> list[list[tuple[list[int], float]]]:
    model = transformers.MarianMTModel.from_pretrained(path).eval()
    tok = transformers.MarianTokenizer.from_pretrained(path)
    enc = tok(sources, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = model.generate(**enc, **options, output_scores=True, return_dict_in_generate=True)
    n = out.sequences.shape[0] // len(sources)
    eos, pad = model.config.eos_token_id, model.config.pad_token_id
    nbest = []
    for i in range(len(sources)):
        hyps = []
        for j in range(i * n, (i + 1) * n):
            seq = [t for t in out.sequences[j].tolist()[1:] if t != pad]
            hyps.append((seq[:-1] if seq and seq[-1] == eos else seq, float(out.sequences_scores[j])))
        nbest.append(hyps)
    return nbest


def _assert_same(ours: list[Any], theirs: list[list[tuple[list[int], float]]]) -> None:
    assert len(ours) == len(theirs)
    for result, hyps in zip(ours, theirs, strict=True):
        assert result.token_ids == [tokens for tokens, _ in hyps]
        assert result.scores == pytest.approx([score for _, score in hyps], abs=1e-4)


def test_a_model_translates_with_its_generation_config_as_generate_does(configured: Path, sources: list[str]) -> None:
    ours = Translator.load(configured, "cpu")
    assert ours.defaults == DecodeOptions(**generation.parse(CONFIG).options)
    texts = sources[:6]
    # The ratio cap (model/options.py) is beamserve's own: off, so that only the file's limits apply.
    mine = ours.translate(texts, max_length_ratio=None)
    assert all(len(r.token_ids) == 2 for r in mine)  # num_return_sequences
    _assert_same(mine, _generate(configured, texts))
    # An option given wins over the file, here as in generate.
    given = ours.translate(texts, beam_size=4, num_hypotheses=1, length_penalty=1.0, max_length_ratio=None)
    _assert_same(given, _generate(configured, texts, num_beams=4, num_return_sequences=1, length_penalty=1.0))


def test_what_beamserve_does_not_apply_is_said_at_load(
    configured: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    for f in configured.iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    config = json.loads((other / generation.FILE).read_text())
    (other / generation.FILE).write_text(json.dumps({**config, "repetition_penalty": 1.3, "renormalize_logits": True}))
    with caplog.at_level(logging.WARNING, logger="model.translator"):
        Translator.load(other, "cpu")
    said = [r.getMessage() for r in caplog.records if "not applied" in r.getMessage()]
    assert said and "repetition_penalty, renormalize_logits" in said[0] and generation.FILE in said[0]
