"""Incremental (cached) decoding equals full recomputation."""

from pathlib import Path

import pytest
import torch

from model import DecodeOptions, Translator
from model.decode.decoding import generate, pad_batch


@pytest.fixture(scope="module")
def tr(tiny_dir: Path) -> Translator:
    return Translator.load(tiny_dir, "cpu")


def test_cached_step_logits_equal_full_recompute(tr: Translator, sources: list[str]) -> None:
    model = tr.model
    batch = [tr.encode(s) for s in sources[:4]]
    src, mask = pad_batch(batch, model.cfg.pad_token_id, tr.device)
    with torch.inference_mode():
        memory = model.encode(src, mask)
        cache = model.new_cache(len(batch), 16, memory.dtype, memory.device)
        cross = model.cross_cache(memory, mask)
        torch.manual_seed(0)
        prefix = torch.randint(0, model.cfg.vocab_size - 1, (len(batch), 12))
        prefix[:, 0] = model.cfg.decoder_start_token_id
        full = model.decode(prefix, memory, mask)  # (B, T, V)
        for pos in range(12):
            step = model.decode_step(prefix[:, pos], pos, cache, cross)
            torch.testing.assert_close(step, full[:, pos], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("beam_size", [1, 2, 4])
def test_cached_search_equals_uncached_search(tr: Translator, sources: list[str], beam_size: int) -> None:
    batch = [tr.encode(s) for s in sources]
    src, mask = pad_batch(batch, tr.model.cfg.pad_token_id, tr.device)
    opts = tr.search_options(DecodeOptions(beam_size=beam_size, num_hypotheses=beam_size))
    caps = torch.full((len(batch),), 40)
    with torch.inference_mode():
        cached = generate(tr.model, src, mask, caps, opts, cached=True)
        uncached = generate(tr.model, src, mask, caps, opts, cached=False)
    assert [[h.tokens for h in hs] for hs in cached] == [[h.tokens for h in hs] for hs in uncached]
    for hs_c, hs_u in zip(cached, uncached, strict=True):
        assert [h.score for h in hs_c] == pytest.approx([h.score for h in hs_u], abs=1e-4)


def test_padded_encoder_output_equals_unpadded(tr: Translator, sources: list[str]) -> None:
    batch = [tr.encode(s) for s in sources[:5]]
    src, mask = pad_batch(batch, tr.model.cfg.pad_token_id, tr.device)
    with torch.inference_mode():
        padded = tr.model.encode(src, mask)
        for i, ids in enumerate(batch):
            alone = tr.model.encode(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.bool))
            torch.testing.assert_close(padded[i, : len(ids)], alone[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_a_padded_batch_decodes_each_sentence_to_the_same_bits_as_alone(tr: Translator, beam_size: int) -> None:
    # One- and two-token sources beside long ones: the cross-attention's padding of short sources
    # and, with one beam, MIN_CROSS_QUERIES keep every sentence on the same kernels alone and batched.
    texts = ["A", "Hi.", "A man in a blue shirt is standing on a ladder cleaning windows.", "Two dogs play."]
    batched = tr.translate(texts, beam_size=beam_size, max_decoding_length=12)
    for text, together in zip(texts, batched, strict=True):
        [alone] = tr.translate([text], beam_size=beam_size, max_decoding_length=12)
        assert (alone.token_ids, alone.scores) == (together.token_ids, together.scores), text
