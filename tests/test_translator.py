"""Translator behaviour: batching equivalences, options, bad input."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model import DecodeOptions, InputTooLongError, InvalidTextError, Translator
from model.decode.decoding import CachedStepper, generate, pad_batch
from model.decode.search import beam_search

from .conftest import REPO


@pytest.fixture(scope="module")
def tr(tiny_dir: Path) -> Translator:
    return Translator.load(tiny_dir, "cpu")


@pytest.mark.parametrize("beam_size", [1, 3, 4])
def test_padded_batch_equals_one_at_a_time(tr: Translator, sources: list[str], beam_size: int) -> None:
    together = tr.translate(sources, beam_size=beam_size, num_hypotheses=beam_size)
    for text, result in zip(sources, together, strict=True):
        alone = tr.translate([text], beam_size=beam_size, num_hypotheses=beam_size)[0]
        assert alone.token_ids == result.token_ids
        assert alone.scores == pytest.approx(result.scores, abs=1e-4)


def test_beam_size_one_equals_greedy_search(tr: Translator, sources: list[str]) -> None:
    # Route the same batch through the beam-search loop with K=1 and compare with the greedy path.
    batch = [tr.encode(s) for s in sources]
    src, mask = pad_batch(batch, tr.model.cfg.pad_token_id, tr.device)
    opts = tr.search_options(DecodeOptions(beam_size=1))
    caps = tr.max_lengths(batch, DecodeOptions())
    with torch.inference_mode():
        greedy = generate(tr.model, src, mask, caps, opts)
        memory = tr.model.encode(src, mask)
        beam = beam_search(CachedStepper(tr.model, memory, mask, 1, int(caps.max())), caps, opts)
    assert [h[0].tokens for h in beam] == [h[0].tokens for h in greedy]
    assert [h[0].score for h in beam] == pytest.approx([h[0].score for h in greedy], abs=1e-5)


def test_small_max_batch_size_gives_the_same_results(tr: Translator, sources: list[str]) -> None:
    big = tr.translate(sources, beam_size=2)
    small = tr.translate(sources, beam_size=2, max_batch_size=3)
    assert [r.token_ids for r in big] == [r.token_ids for r in small]


def test_n_best_lists_are_sorted_and_distinct(tr: Translator, sources: list[str]) -> None:
    for r in tr.translate(sources[:4], beam_size=5, num_hypotheses=5):
        assert len(r.hypotheses) == 5
        assert r.scores == sorted(r.scores, reverse=True)
        assert len({tuple(t) for t in r.token_ids}) == 5


def test_empty_input_translates_to_empty_output(tr: Translator) -> None:
    results = tr.translate(["", "   ", "A dog."])
    assert results[0].hypotheses == [""] and results[1].hypotheses == [""]
    assert results[2].hypotheses[0] != ""


def test_over_long_source_is_rejected_or_truncated_on_request(tr: Translator) -> None:
    limit = tr.max_source_tokens
    text = "dog " * (limit + 10)
    with pytest.raises(InputTooLongError, match=rf"texts\[1\]: .*at most {limit}"):
        tr.translate(["A dog.", text])
    result = tr.translate([text], truncate=True, max_decoding_length=5)[0]
    assert result.source_tokens == limit


def test_text_that_is_not_unicode_is_a_clear_error(tr: Translator) -> None:
    # A lone surrogate: what JSON's "\\ud800" or undecodable bytes read with surrogateescape become.
    with pytest.raises(InvalidTextError, match=r"texts\[1\]: character 2 is a lone surrogate U\+D800"):
        tr.translate(["A dog.", "A \ud800 dog."])
    assert tr.translate(["A \u00e9t\u00e9 \U0001f6b2 dog."])[0].hypotheses[0]  # valid non-ASCII is fine


def test_max_decoding_length_caps_output(tr: Translator, sources: list[str]) -> None:
    for r in tr.translate(sources, beam_size=2, max_decoding_length=3):
        assert len(r.token_ids[0]) <= 3


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(beam_size=0), "beam_size"),
        (dict(beam_size=2, num_hypotheses=3), "num_hypotheses"),
        (dict(max_decoding_length=0), "max_decoding_length"),
        (dict(length_penalty=float("nan")), "length_penalty"),
    ],
)
def test_bad_options_raise_clear_errors(tr: Translator, options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tr.translate(["A dog."], **options)


def test_unknown_model_name_lists_the_shipped_ones() -> None:
    with pytest.raises(FileNotFoundError, match="en-de"):
        Translator.load("xx-yy")


def test_result_repr_shows_the_best_translation(tr: Translator) -> None:
    r = tr.translate(["A dog runs."])[0]
    assert repr(r).startswith("TranslationResult(")
    assert r.hypotheses[0] in repr(r)


def test_loads_and_translates_where_the_os_has_no_cpu_affinity(monkeypatch: pytest.MonkeyPatch) -> None:
    """macOS and Windows have no os.sched_getaffinity: the CPU count comes from os.cpu_count there."""
    import os

    from model.kernels.cpus import usable_cpus

    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    assert usable_cpus() == os.cpu_count()
    tr = Translator.load("en-de", "cpu")
    assert tr.translate(["A dog runs."])[0].hypotheses[0]


def test_loading_a_model_leaves_torch_s_compiler_unimported() -> None:
    """A model built to hold loaded weights runs no initialisation on the meta device: meta ops go through
    torch's Python reference ops, which import torch._dynamo (about 2 s of CPU on every load)."""
    code = (
        "import sys; from model import Translator; "
        "Translator.load('en-de', 'cpu'); print('torch._dynamo' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert done.stdout.strip() == "False", done.stderr[-2000:]
