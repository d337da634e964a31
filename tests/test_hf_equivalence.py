"""Ours = Hugging Face transformers on the same weights: tokens, logits, greedy and beam search."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from model import TranslationResult, Translator
from model.io import checkpoint

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hf")
    checkpoint.export_hf(tiny_dir, out)
    return out


@pytest.fixture(scope="module")
def hf(hf_dir: Path):  # type: ignore[no-untyped-def]
    model = transformers.MarianMTModel.from_pretrained(hf_dir).eval()
    return model, transformers.MarianTokenizer.from_pretrained(hf_dir)


@pytest.fixture(scope="module")
def ours(tiny_dir: Path) -> Translator:
    return Translator.load(tiny_dir, "cpu")


def test_tokenization_matches_marian_tokenizer(hf, ours: Translator, sources: list[str]) -> None:  # type: ignore[no-untyped-def]
    _, tok = hf
    for text in [*sources, ">>de<< A dog.", "Ünïcödé ça va?"]:
        assert ours.tokenizer.encode(text) == tok(text).input_ids


def test_logits_match(hf, ours: Translator, sources: list[str]) -> None:  # type: ignore[no-untyped-def]
    model, tok = hf
    enc = tok(sources, return_tensors="pt", padding=True)
    torch.manual_seed(0)
    dec = torch.randint(0, ours.model.cfg.vocab_size - 1, (len(sources), 9))
    dec[:, 0] = ours.model.cfg.decoder_start_token_id
    with torch.inference_mode():
        theirs = model(input_ids=enc.input_ids, attention_mask=enc.attention_mask, decoder_input_ids=dec).logits
        mine = ours.model(enc.input_ids, enc.attention_mask.bool(), dec)
    torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)


def assert_same_as_generate(  # type: ignore[no-untyped-def]
    hf,
    ours: Translator,
    sources: list[str],
    beam_size: int,
    num_hypotheses: int,
    **options: object,
) -> list[TranslationResult]:
    """Ours and HF `generate` with the same options (both take these names): equal n-best tokens, texts
    and scores; returns ours."""
    model, tok = hf
    enc = tok(sources, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = model.generate(
            **enc,
            num_beams=beam_size,
            num_return_sequences=num_hypotheses,
            **options,
            max_new_tokens=30,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
        )
    mine = ours.translate(
        sources,
        beam_size=beam_size,
        num_hypotheses=num_hypotheses,
        **options,
        max_decoding_length=30,
        max_length_ratio=None,
    )
    eos, pad = ours.model.cfg.eos_token_id, ours.model.cfg.pad_token_id
    for i, result in enumerate(mine):
        for j in range(num_hypotheses):
            seq = [t for t in out.sequences[i * num_hypotheses + j].tolist()[1:] if t != pad]
            assert result.token_ids[j] == (seq[:-1] if seq and seq[-1] == eos else seq)
            if beam_size > 1:
                assert result.scores[j] == pytest.approx(float(out.sequences_scores[i * num_hypotheses + j]), abs=1e-4)
        texts = tok.batch_decode(out.sequences[i * num_hypotheses : (i + 1) * num_hypotheses], skip_special_tokens=True)
        assert result.hypotheses == texts
    return mine


@pytest.mark.parametrize(
    ("beam_size", "num_hypotheses", "length_penalty"),
    [(1, 1, 1.0), (2, 1, 1.0), (4, 1, 1.0), (4, 4, 0.6), (5, 3, 2.0), (3, 2, 0.0)],
)
def test_generate_outputs_and_scores_match(  # type: ignore[no-untyped-def]
    hf,
    ours: Translator,
    sources: list[str],
    beam_size: int,
    num_hypotheses: int,
    length_penalty: float,
) -> None:
    assert_same_as_generate(hf, ours, sources, beam_size, num_hypotheses, length_penalty=length_penalty)


def test_min_decoding_length_matches_min_new_tokens(hf, ours: Translator, sources: list[str]) -> None:  # type: ignore[no-untyped-def]
    model, tok = hf
    enc = tok(sources, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = model.generate(**enc, num_beams=3, min_new_tokens=12, max_new_tokens=30)
    mine = ours.translate(sources, beam_size=3, min_decoding_length=12, max_decoding_length=30, max_length_ratio=None)
    assert [r.hypotheses[0] for r in mine] == tok.batch_decode(out, skip_special_tokens=True)


@pytest.mark.parametrize(("ngram", "beam_size", "num_hypotheses"), [(1, 1, 1), (2, 1, 1), (2, 4, 2), (3, 3, 3)])
def test_no_repeat_ngram_size_matches_hf(  # type: ignore[no-untyped-def]
    hf,
    ours: Translator,
    sources: list[str],
    ngram: int,
    beam_size: int,
    num_hypotheses: int,
) -> None:
    mine = assert_same_as_generate(hf, ours, sources, beam_size, num_hypotheses, no_repeat_ngram_size=ngram)
    plain = ours.translate(sources, beam_size=beam_size, max_decoding_length=30, max_length_ratio=None)
    # The random model repeats itself, so the option has something to change.
    assert [r.token_ids[0] for r in mine] != [r.token_ids[0] for r in plain]
    for ids in (ids for r in mine for ids in r.token_ids):
        grams = [tuple(ids[k : k + ngram]) for k in range(len(ids) - ngram + 1)]
        assert len(grams) == len(set(grams))


def test_hf_directory_loads_and_round_trips_losslessly(hf_dir: Path, tmp_path: Path, sources: list[str]) -> None:
    imported = Translator.load(hf_dir, "cpu")
    checkpoint.export_hf(hf_dir, tmp_path / "again")
    first = load_file(str(hf_dir / "model.safetensors"))
    second = load_file(str(tmp_path / "again" / "model.safetensors"))
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name
    again = Translator.load(tmp_path / "again", "cpu")
    assert [r.token_ids for r in imported.translate(sources)] == [r.token_ids for r in again.translate(sources)]


def test_hf_native_checkpoint_imports(tmp_path: Path, hf_dir: Path, sources: list[str]) -> None:
    """A MarianMTModel saved by transformers itself (all its tied copies) loads and matches HF."""
    import shutil

    config = transformers.MarianConfig.from_pretrained(hf_dir)
    torch.manual_seed(3)
    native = transformers.MarianMTModel(config).eval()
    native.save_pretrained(tmp_path)
    for name in ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json"):
        shutil.copyfile(hf_dir / name, tmp_path / name)
    ours = Translator.load(tmp_path, "cpu")
    tok = transformers.MarianTokenizer.from_pretrained(tmp_path)
    enc = tok(sources, return_tensors="pt", padding=True)
    dec = torch.full((len(sources), 1), config.decoder_start_token_id)
    with torch.inference_mode():
        theirs = native(**enc, decoder_input_ids=dec).logits
        mine = ours.model(enc.input_ids, enc.attention_mask.bool(), dec)
    torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)
