"""Every OPUS-MT layout, against Hugging Face on the same weights: Marian models built here with
transformers (random weights, seeded: enough for equivalence) with separate source and target
vocabularies, and a multilingual model whose source names the target language with a >>xx<< token.
Tokens, logits, greedy and beam search, texts and scores must equal `generate`'s."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from model import Translator
from model.io import checkpoint
from model.nn.config import preset

from .test_hf_equivalence import assert_same_as_generate

transformers = pytest.importorskip("transformers")

EXTRA_TARGET_PIECES = 37  # the target vocabulary is larger than the source one, and ordered otherwise


def small_config(**sizes: Any) -> Any:
    """A MarianConfig of the `tiny` preset's sizes (model/nn/config.py)."""
    tiny = preset("tiny", 8)
    layers = ("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads")
    return transformers.MarianConfig(
        **{name: getattr(tiny, name) for name in (*layers, "encoder_ffn_dim", "decoder_ffn_dim")},
        max_position_embeddings=128,
        init_std=0.3,  # logits far apart: no near-ties for rounding to break differently
        eos_token_id=0,
        forced_eos_token_id=0,
        **sizes,
    )


def save_marian(config: Any, out: Path, tokenizer_from: Path, vocab: dict[str, int], **extra: Any) -> Path:
    """A MarianMTModel with seeded random weights, saved by transformers with its tokenizer files."""
    torch.manual_seed(11)
    model = transformers.MarianMTModel(config).eval()
    model.generation_config.bad_words_ids = [[config.pad_token_id]]
    model.save_pretrained(out)
    for name in ("source.spm", "target.spm"):
        shutil.copyfile(tokenizer_from / name, out / name)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    tokenizer = {"tokenizer_class": "MarianTokenizer", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    (out / "tokenizer_config.json").write_text(json.dumps({**tokenizer, **extra}))
    return out


@pytest.fixture(scope="module")
def separate(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Source vocabulary: the tiny model's. Target vocabulary: the same pieces in another order, and
    more of them; </s>, <unk> and <pad> keep their ids (Marian's convention)."""
    vocab = json.loads((tiny_dir / "vocab.json").read_text(encoding="utf-8"))
    pad = vocab["<pad>"]
    ordinary = [p for p in vocab if p not in ("</s>", "<unk>", "<pad>")]
    random.Random(5).shuffle(ordinary)
    pieces = ordinary + [f"▁extra{i}" for i in range(EXTRA_TARGET_PIECES)]
    target = {"</s>": 0, "<unk>": 1, "<pad>": pad}
    free = (i for i in range(2, len(pieces) + 3) if i != pad)
    target.update({p: next(free) for p in pieces})
    assert len(set(target.values())) == len(target) == len(vocab) + EXTRA_TARGET_PIECES
    config = small_config(
        vocab_size=len(vocab),
        decoder_vocab_size=len(target),
        share_encoder_decoder_embeddings=False,
        pad_token_id=pad,
        decoder_start_token_id=pad,
    )
    out = save_marian(config, tmp_path_factory.mktemp("separate"), tiny_dir, vocab, separate_vocabs=True)
    (out / "target_vocab.json").write_text(json.dumps(target, ensure_ascii=False))
    return out


@pytest.fixture(scope="module")
def multilingual(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A shared vocabulary holding target-language tokens, as opus-mt-en-ROMANCE's does."""
    vocab = json.loads((tiny_dir / "vocab.json").read_text(encoding="utf-8"))
    vocab.pop("<pad>")
    for code in (">>fra<<", ">>spa<<", ">>ita<<"):
        vocab[code] = len(vocab)
    vocab["<pad>"] = len(vocab)
    pad = vocab["<pad>"]
    config = small_config(vocab_size=len(vocab), pad_token_id=pad, decoder_start_token_id=pad)
    return save_marian(config, tmp_path_factory.mktemp("multilingual"), tiny_dir, vocab)


def hf_pair(path: Path) -> tuple[Any, Any]:
    return transformers.MarianMTModel.from_pretrained(path).eval(), transformers.MarianTokenizer.from_pretrained(path)


def test_separate_vocabularies_tokenize_and_score_as_hugging_face(separate: Path, sources: list[str]) -> None:
    model, tok = hf_pair(separate)
    ours = Translator.load(separate, "cpu")
    cfg = ours.model.cfg
    assert (cfg.share_embeddings, cfg.vocab_size, cfg.decoder_vocab_size) == (False, tok.vocab_size, 437)
    assert ours.model.target_embed is not None and ours.model.output_weight.shape[0] == cfg.decoder_vocab_size
    for text in sources:
        assert ours.tokenizer.encode(text) == tok(text).input_ids
        assert ours.tokenizer.encode_target(text) == tok(text_target=text).input_ids  # the target vocabulary
    enc = tok(sources, return_tensors="pt", padding=True)
    torch.manual_seed(0)
    dec = torch.randint(0, cfg.decoder_vocab_size - 1, (len(sources), 9))
    dec[:, 0] = cfg.decoder_start_token_id
    with torch.inference_mode():
        theirs = model(input_ids=enc.input_ids, attention_mask=enc.attention_mask, decoder_input_ids=dec).logits
        mine = ours.model(enc.input_ids, enc.attention_mask.bool(), dec)
    assert mine.shape[-1] == cfg.decoder_vocab_size
    torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("beam_size", "num_hypotheses"), [(1, 1), (4, 1), (4, 3)])
def test_separate_vocabularies_generate_as_hugging_face(
    separate: Path, sources: list[str], beam_size: int, num_hypotheses: int
) -> None:
    ours = Translator.load(separate, "cpu")
    mine = assert_same_as_generate(hf_pair(separate), ours, sources, beam_size, num_hypotheses)
    # The texts come from the target vocabulary: read through the source one, the same ids say otherwise.
    as_source = {i: p for p, i in ours.tokenizer.vocab.items()}
    misread = [
        ours.tokenizer.target.decode_pieces([as_source[t] for t in r.token_ids[0] if t in as_source]) for r in mine
    ]
    assert all(a != b for a, b in zip(misread, (r.hypotheses[0] for r in mine), strict=True) if b)


def test_separate_vocabularies_export_and_reload_losslessly(separate: Path, tmp_path: Path, sources: list[str]) -> None:
    first = Translator.load(separate, "cpu")
    checkpoint.export_hf(separate, tmp_path / "again")
    assert (tmp_path / "again" / "target_vocab.json").read_text() == (separate / "target_vocab.json").read_text()
    saved = load_file(str(tmp_path / "again" / "model.safetensors"))
    assert "model.shared.weight" not in saved and "model.decoder.embed_tokens.weight" in saved
    again = Translator.load(tmp_path / "again", "cpu")
    assert first.digest == again.digest
    assert [r.token_ids for r in first.translate(sources)] == [r.token_ids for r in again.translate(sources)]
    # Our own format keeps both vocabularies too.
    checkpoint.save(first.model, tmp_path / "own", separate)
    own = Translator.load(tmp_path / "own", "cpu")
    assert [r.hypotheses for r in own.translate(sources)] == [r.hypotheses for r in first.translate(sources)]


def test_a_multilingual_model_takes_its_target_from_the_language_token(multilingual: Path, sources: list[str]) -> None:
    hf = hf_pair(multilingual)
    ours = Translator.load(multilingual, "cpu")
    vocab = json.loads((multilingual / "vocab.json").read_text())
    for code in (">>fra<<", ">>spa<<"):
        prefixed = [f"{code} {s}" for s in sources]
        assert all(ours.tokenizer.encode(t)[0] == vocab[code] for t in prefixed)
        assert [ours.tokenizer.encode(t) for t in prefixed] == [hf[1](t).input_ids for t in prefixed]
        assert_same_as_generate(hf, ours, prefixed, 4, 2)
    # The token decides the output: the same sentences toward two languages differ.
    fra = ours.translate([f">>fra<< {s}" for s in sources])
    spa = ours.translate([f">>spa<< {s}" for s in sources])
    assert [r.token_ids for r in fra] != [r.token_ids for r in spa]


@pytest.mark.parametrize("static_slots", [False, True])
def test_the_batching_engine_decodes_separate_vocabularies_as_offline(
    separate: Path, sources: list[str], static_slots: bool
) -> None:
    """Continuous batching (its in-flight batch, and the static decode state) embeds target tokens
    through the target embedding, as the offline decoder does."""
    import asyncio

    from model import DecodeOptions
    from service.batching import sized_for
    from service.engine.engine import Engine

    ours = Translator.load(separate, "cpu")
    offline = ours.translate(sources, beam_size=4)
    engine = Engine(ours, sized_for("cpu", {"mode": "continuous"}), max_length=256, static_slots=static_slots)
    try:

        async def each() -> list[Any]:
            ids = [ours.encode(s) for s in sources]
            return list(await asyncio.gather(*(engine.translate([i], DecodeOptions(beam_size=4), 60.0) for i in ids)))

        served = asyncio.run(each())
    finally:
        engine.close()
    assert [[h.tokens for h in hyps[0]] for hyps in served] == [r.token_ids for r in offline]
