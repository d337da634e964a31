"""Translator.score = transformers' teacher-forced log-probabilities on the same weights (the shipped Marian
models, an NLLB and an M2M100 directory built here), and = the search's own score for its translation."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from model import InputTooLongError, Translator
from model.decode.confidence import confidence
from model.io import checkpoint
from model.io.tokenizer import LanguageError
from model.shipped import resolve_model_path
from tests.conftest import read_lines

transformers = pytest.importorskip("transformers")

TARGETS = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "", "Ein Ünïcödé-Wort, ein langes Wort."]


def hf_log_probs(model, enc, labels: torch.Tensor) -> list[list[float]]:
    """Each label's log-probability in a forward pass with `labels` (transformers shifts them right itself);
    labels padded with -100."""
    with torch.inference_mode():
        logits = model(**enc, labels=labels).logits.float().log_softmax(-1)  # (B, T, V)
    out = []
    for row, lp in zip(labels, logits, strict=True):
        keep = row != -100
        out.append(lp[keep].gather(-1, row[keep][:, None])[:, 0].tolist())
    return out


def padded(ids: list[list[int]]) -> torch.Tensor:
    width = max(map(len, ids))
    return torch.tensor([row + [-100] * (width - len(row)) for row in ids])


def assert_scores_equal(mine, theirs: list[list[float]]) -> None:
    assert [len(r.log_probs) for r in mine] == [len(t) for t in theirs]
    for r, t in zip(mine, theirs, strict=True):
        assert r.log_probs == pytest.approx(t, abs=1e-4)
        assert r.total == pytest.approx(sum(t), abs=1e-4)
        assert r.normalized == pytest.approx(sum(t) / len(t), abs=1e-4)


@pytest.mark.parametrize("name", ["en-de", "en-fr"])
def test_the_shipped_models_score_as_marian_in_transformers(name: str, tmp_path: Path) -> None:
    checkpoint.export_hf(resolve_model_path(name), tmp_path)
    model = transformers.MarianMTModel.from_pretrained(tmp_path).eval()
    tok = transformers.MarianTokenizer.from_pretrained(tmp_path)
    ours = Translator.load(name, "cpu")
    sources = [*read_lines("val.en.gz", len(TARGETS) - 1), ""]  # a blank source: </s> alone, as theirs
    targets = TARGETS if name == "en-de" else ["Un homme fait du vélo.", "Deux chiens jouent.", "", "Un mot."]
    mine = ours.score(sources, targets)
    labels = [tok(text_target=t).input_ids for t in targets]
    assert [r.tokens for r in mine] == [tok.convert_ids_to_tokens(ids) for ids in labels]
    assert mine[2].tokens == ["</s>"]  # an empty target: </s> alone
    enc = tok(sources, return_tensors="pt", padding=True)
    assert_scores_equal(mine, hf_log_probs(model, enc, padded(labels)))


def test_nllb_scores_with_the_target_language_first(nllb_dir: Path) -> None:
    model = transformers.M2M100ForConditionalGeneration.from_pretrained(nllb_dir).eval()
    tok = transformers.AutoTokenizer.from_pretrained(nllb_dir, src_lang="eng_Latn", tgt_lang="deu_Latn")
    ours = Translator.load(nllb_dir, "cpu")
    sources = read_lines("val.en.gz", len(TARGETS))
    mine = ours.score(sources, TARGETS, src_lang="eng_Latn", tgt_lang="deu_Latn")
    enc = tok(sources, return_tensors="pt", padding=True)
    labels = [tok(text_target=t).input_ids for t in TARGETS]
    assert all(r.tokens[0] == "deu_Latn" and r.forced == 1 for r in mine)
    assert_scores_equal(mine, hf_log_probs(model, enc, padded(labels)))
    with pytest.raises(LanguageError):
        ours.score(sources[:1], TARGETS[:1], src_lang="eng_Latn")


def test_m2m100_scores_as_transformers(m2m100_dir: Path) -> None:
    model = transformers.M2M100ForConditionalGeneration.from_pretrained(m2m100_dir).eval()
    tok = transformers.M2M100Tokenizer.from_pretrained(m2m100_dir, src_lang="en", tgt_lang="de")
    ours = Translator.load(m2m100_dir, "cpu")
    sources = read_lines("val.en.gz", len(TARGETS))
    mine = ours.score(sources, TARGETS, src_lang="en", tgt_lang="de")
    enc = tok(sources, return_tensors="pt", padding=True)
    labels = [tok(text_target=t).input_ids for t in TARGETS]
    assert_scores_equal(mine, hf_log_probs(model, enc, padded(labels)))


def test_a_translation_scores_what_the_search_gave_it_and_a_batch_what_each_alone() -> None:
    """Scoring the search's own best translation gives its score back (cached decoding = teacher forcing),
    and pairs scored in one batch score as each alone."""
    ours = Translator.load("en-de", "cpu")
    sources = read_lines("test_2016_flickr.en.gz", 16)
    found = ours.translate(sources, beam_size=4, length_penalty=1.0)
    mine = ours.score(sources, [r.hypotheses[0] for r in found], batch_size=5)
    same = 0
    for r, s in zip(found, mine, strict=True):
        if ours.tokenizer.spans(r.hypotheses[0], target=True)[0] != r.token_ids[0]:
            continue  # its text tokenizes otherwise than the search wrote it
        same += 1
        generated = len(r.token_ids[0]) + 1
        assert s.total == pytest.approx(r.scores[0] * generated, abs=1e-4)
        assert s.confidence == pytest.approx(confidence(r.scores[0], generated, 1.0), rel=1e-4)
    assert same >= 12
    alone = [ours.score([src], [r.hypotheses[0]])[0] for src, r in zip(sources, found, strict=True)]
    for a, b in zip(alone, mine, strict=True):
        assert a.log_probs == pytest.approx(b.log_probs, abs=1e-5)


def test_what_cannot_be_scored_is_refused_by_index(tiny_dir: Path) -> None:
    ours = Translator.load(tiny_dir, "cpu")
    with pytest.raises(ValueError, match="one target per source"):
        ours.score(["a"], [])
    with pytest.raises(InputTooLongError, match=r"texts\[0\]"):
        ours.score(["A dog."], ["Hund " * 600])
    with pytest.raises(Exception, match="lone surrogate"):
        ours.score(["A dog."], ["\ud800"])
    assert math.isfinite(ours.score(["A dog."], ["Ein Hund."])[0].normalized)


def test_the_command_line_scores_a_line_of_translations_per_source(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    from tests.conftest import REPO

    sources, targets = ["A man is riding a bike.", "Two dogs."], ["Ein Mann fährt Fahrrad.", "Zwei Hunde."]
    (tmp_path / "src.txt").write_text("\n".join(sources) + "\n")
    (tmp_path / "tgt.txt").write_text("\n".join(targets) + "\n")

    def beamserve(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "service.cli", "score", "--model", "en-de", "--quiet", *args]
        return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)

    files = ("--src", str(tmp_path / "src.txt"), "--tgt", str(tmp_path / "tgt.txt"))
    plain, rows = beamserve(*files), beamserve(*files, "--json")
    assert plain.returncode == 0 and rows.returncode == 0, plain.stderr + rows.stderr
    want = Translator.load("en-de", "cpu").score(sources, targets)
    assert [float(x) for x in plain.stdout.split()] == pytest.approx([w.normalized for w in want], abs=1e-5)
    got = [json.loads(line) for line in rows.stdout.splitlines()]
    assert [g["tokens"] for g in got] == [w.tokens for w in want]
    (tmp_path / "tgt.txt").write_text("Ein Mann.\n")
    short = beamserve(*files)
    assert short.returncode == 2 and "2 lines in --src, 1 in --tgt" in short.stderr
