"""Continuous batching: every sentence decodes exactly as it would alone, whoever it shares steps with."""

from __future__ import annotations

import functools
import random
from collections.abc import Hashable

import pytest
import torch

from model import DecodeOptions, Translator
from model.decode.inflight import TOKEN_WIDTH, InflightBatch
from model.decode.search import Hypothesis
from model.kernels.compute_type import supported
from model.nn.config import preset
from model.nn.transformer import Seq2Seq
from tests.conftest import bfloat16_rows_invariant, read_lines
from tests.test_compute_type import BF16_SCORES


@functools.cache
def load(compute_type: str) -> Translator:
    return Translator.load("en-de", "cpu", compute_type=compute_type, num_threads=2)


@pytest.fixture(scope="module")
def tr() -> Translator:
    return load("float32")


OTHER_TYPES = [t for t in ("int8", "bfloat16", "int8_bfloat16") if t in supported(torch.device("cpu"))]
Arrival = tuple[int, int, list[int], DecodeOptions]  # (step, key, source ids, options)


def run(tr: Translator, batch: InflightBatch, arrivals: list[Arrival]) -> tuple[dict[Hashable, list[Hypothesis]], int]:
    """Feed sentences in at their step, step until all finish; returns results and the most sentences in flight."""
    pending = sorted(arrivals, key=lambda a: a[0])
    results: dict[Hashable, list[Hypothesis]] = {}
    step = most = 0
    while pending or batch.rows:
        while pending and pending[0][0] <= step:
            _, key, ids, opts = pending.pop(0)
            batch.add([key], [ids], tr.max_lengths([ids], opts).tolist(), tr.search_options(opts))
        most = max(most, batch.sentences)
        results.update(batch.step())
        step += 1
    return results, most


def assert_same_as_alone(
    tr: Translator, arrivals: list[Arrival], results: dict[Hashable, list[Hypothesis]], *, exact: bool = True
) -> None:
    for _, key, ids, opts in arrivals:
        alone = tr.decode_batch([ids], opts)[0]
        assert [h.tokens for h in results[key]] == [h.tokens for h in alone], (key, opts)
        # To the bit: padding-blind decode steps (layers.step_attention) and row-wise GEMMs (model/kernels/gemm.py).
        got, want = [h.score for h in results[key]], [h.score for h in alone]
        assert got == want if exact else got == pytest.approx(want, abs=BF16_SCORES), (key, opts)


@pytest.mark.parametrize(
    ("compute_type", "first_step_apart"),  # False: as on a GPU, K rows from the start
    [("float32", True), ("float32", False)] + [(t, True) for t in OTHER_TYPES],
)
def test_mixed_lengths_beams_and_arrival_times_equal_decoding_alone(compute_type: str, first_step_apart: bool) -> None:
    tr = load(compute_type)
    rng = random.Random(0)
    texts = read_lines("test_2016_flickr.en.gz", 36)
    texts += [" ".join(texts[i : i + 4]) for i in (0, 8)]  # long sources
    arrivals: list[Arrival] = []
    for key, text in enumerate(texts):
        beam = rng.choice([1, 2, 4, 5])
        opts = DecodeOptions(
            beam_size=beam,
            num_hypotheses=min(2, beam),
            length_penalty=rng.choice([1.0, 0.6]),
            no_repeat_ngram_size=2 * (key % 4 == 0),
        )
        arrivals.append((rng.randrange(0, 40), key, tr.encode(text), opts))
    batch = InflightBatch(tr.model, rows=128, max_length=256)
    batch.first_step_apart = first_step_apart
    results, most = run(tr, batch, arrivals)
    assert most >= 10  # sentences really shared decoder steps
    assert batch.rows == 0 and batch.sentences == 0 and batch.cross is None
    # bfloat16 on CPUs with AMX: scores within BF16_SCORES (conftest.bfloat16_rows_invariant).
    assert_same_as_alone(tr, arrivals, results, exact=compute_type != "bfloat16" or bfloat16_rows_invariant())


def test_random_model_running_to_each_sentences_own_limit() -> None:
    # Random weights rarely emit </s>: every sentence runs to its own max length, joining at different steps.
    torch.manual_seed(0)
    model = Seq2Seq(preset("tiny", vocab_size=300)).eval()
    tr = Translator(model, tokenizer=None, device=torch.device("cpu"))  # type: ignore[arg-type]
    rng = random.Random(1)
    arrivals: list[Arrival] = []
    for key in range(12):
        ids = [rng.randrange(2, 299) for _ in range(rng.randrange(2, 20))] + [0]
        cap = rng.randrange(5, 80)
        # Every third sentence bans repeated bigrams, every third trigrams: random weights repeat themselves.
        opts = DecodeOptions(
            beam_size=rng.choice([1, 3]),
            max_decoding_length=cap,
            max_length_ratio=None,
            no_repeat_ngram_size=(0, 2, 3)[key % 3],
        )
        arrivals.append((rng.randrange(0, 30), key, ids, opts))
    batch = InflightBatch(model, rows=64, max_length=100)
    results, _ = run(tr, batch, arrivals)
    assert batch.cache.max_length > 64  # the cache grew past its first 64 positions while rows decoded
    assert max(len(h[0].tokens) for h in results.values()) > 2 * TOKEN_WIDTH  # token buffers widened twice
    assert_same_as_alone(tr, arrivals, results)
    for _, key, _, opts in arrivals:  # the bans held, mid-batch too
        n, ids = opts.no_repeat_ngram_size, results[key][0].tokens
        if n:
            grams = [tuple(ids[k : k + n]) for k in range(len(ids) - n + 1)]
            assert len(grams) == len(set(grams)), key


def test_removed_sentences_free_their_rows_and_leave_the_others_unchanged(tr: Translator) -> None:
    texts = read_lines("test_2016_flickr.en.gz", 6)
    opts = DecodeOptions(beam_size=4)
    batch = InflightBatch(tr.model, rows=64, max_length=256)
    ids = [tr.encode(t) for t in texts]
    batch.add(list(range(6)), ids, tr.max_lengths(ids, opts).tolist(), tr.search_options(opts))
    assert batch.rows == 24
    for _ in range(3):
        assert batch.step() == []
    batch.remove({1, 4})
    assert batch.rows == 16 and sorted(batch.keys()) == [0, 2, 3, 5]  # type: ignore[type-var]
    results, _ = run(tr, batch, [])
    assert sorted(results) == [0, 2, 3, 5]  # type: ignore[type-var]
    assert_same_as_alone(tr, [(0, k, ids[k], opts) for k in (0, 2, 3, 5)], results)


def test_pool_refuses_sentences_past_its_rows(tr: Translator) -> None:
    batch = InflightBatch(tr.model, rows=8, max_length=256)
    opts = DecodeOptions(beam_size=4)
    ids = tr.encode("A dog runs.")
    batch.add(["a", "b"], [ids, ids], [20, 20], tr.search_options(opts))
    with pytest.raises(IndexError, match="rows"):
        batch.add(["c"], [ids], [20], tr.search_options(opts))
    batch.step()
    assert batch.rows == 8  # nothing was half-added


@pytest.mark.parametrize("slotted", [False, True], ids=["compacted", "slotted"])
def test_finished_sentences_keys_stay_until_a_quarter_or_a_join(tr: Translator, slotted: bool) -> None:
    """Finished sentences' cross-attention keys are dropped in bulk (each drop copies every live
    sentence's), and the sentences still running decode as they would alone meanwhile. Slotted (the C
    attention's, the CPU default), a newcomer takes a finished sentence's slot and nothing moves until
    three quarters of the slots are free."""
    texts = read_lines("test_2016_flickr.en.gz", 8)
    opts = DecodeOptions(beam_size=2)
    sources = [tr.encode(t) for t in texts]
    caps = [min(cap, 3 + 2 * i) for i, cap in enumerate(tr.max_lengths(sources, opts).tolist())]  # staggered ends
    batch = InflightBatch(tr.model, rows=64, max_length=256)
    assert batch.slotted  # float32 on CPU, the library built
    batch.slotted = slotted
    batch.add(list(range(8)), sources, caps, tr.search_options(opts))
    kept: list[tuple[int, int]] = []  # (sentences running, sentences in the cross-attention cache) a step
    results: dict[Hashable, list[Hypothesis]] = {}
    while batch.sentences > 6:
        results.update(batch.step())
        assert batch.cross is not None
        kept.append((batch.sentences, batch.cross.src_mask.shape[0]))
    assert (7, 8) in kept  # one finished: its keys stay
    assert kept[-1] == ((6, 8) if slotted else (6, 6))  # two of eight are a quarter: both go at once
    late = tr.encode("A dog runs.")
    batch.add(["late"], [late], tr.max_lengths([late], opts).tolist(), tr.search_options(opts))
    assert batch.cross is not None
    if slotted:  # into a finished sentence's slot
        [group] = batch.groups.values()
        assert batch.cross.src_mask.shape[0] == 8 and int(group.sentence[-1]) < 2
    after: list[tuple[int, int]] = []
    while batch.sentences:
        results.update(batch.step())
        if batch.cross is not None:
            after.append((batch.sentences, batch.cross.src_mask.shape[0]))
    assert all(B < 8 for n, B in after if n <= 2)  # compacted once at most a quarter of the slots were live
    for i, ids in enumerate(sources):
        alone = tr.decode_batch([ids], DecodeOptions(beam_size=2, max_decoding_length=caps[i]))[0]
        assert [h.tokens for h in results[i]] == [h.tokens for h in alone]
    assert [h.tokens for h in results["late"]] == [h.tokens for h in tr.decode_batch([late], opts)[0]]


def test_a_sentence_that_ends_at_its_first_step_comes_back_from_the_next_step(tr: Translator) -> None:
    texts = read_lines("test_2016_flickr.en.gz", 3)
    ids = [tr.encode(t) for t in texts]
    batch = InflightBatch(tr.model, rows=64, max_length=256)
    opts = DecodeOptions(beam_size=4)
    batch.add([0, 1], ids[:2], tr.max_lengths(ids[:2], opts).tolist(), tr.search_options(opts))
    one = DecodeOptions(beam_size=4, max_decoding_length=1)  # </s> forced at the first step
    batch.add([2], ids[2:], [1], tr.search_options(one))
    assert batch.rows == 8 and sorted(batch.keys()) == [0, 1]  # type: ignore[type-var]
    first = dict(batch.step())
    assert list(first) == [2] and [h.tokens for h in first[2]] == [h.tokens for h in tr.decode_batch(ids[2:], one)[0]]
    results, _ = run(tr, batch, [])
    assert_same_as_alone(tr, [(0, k, ids[k], opts) for k in (0, 1)], results)


def test_a_small_reorder_places_beams_as_the_tensor_rule_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """kv_cache.continue_in_place over lists (a few sentences' beams) and over tensors: the same rows."""
    from model.nn import kv_cache

    rng = random.Random(5)
    for _ in range(3000):
        b, K = rng.randint(1, 4), rng.randint(1, 6)
        rows = torch.stack([torch.randperm(40)[:K] for _ in range(b)])  # (b, K) each sentence's own rows
        # each beam continues one of its sentence's rows, now and then a row it does not own
        parents = torch.tensor([[rng.choice([*r.tolist(), rng.randrange(40)]) for _ in range(K)] for r in rows])
        listed = kv_cache.continue_in_place(parents, rows)
        monkeypatch.setattr(kv_cache, "SMALL_REORDER", 0)
        assert torch.equal(listed, kv_cache.continue_in_place(parents, rows)), (parents, rows)
        monkeypatch.setattr(kv_cache, "SMALL_REORDER", 64)
