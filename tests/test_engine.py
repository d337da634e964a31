"""The batching engine with the real shipped model: continuous batching, request batching, no batching."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import torch
from pydantic import ValidationError

from model import DecodeOptions, Translator
from model.decode.search import Hypothesis
from service.batching import BatchingConfig
from service.engine.engine import Engine, RequestTiming
from service.engine.scheduler import DeadlineExceededError, QueueFullError, RequestTooLargeError
from service.engine.slot_runner import SlotStepRunner
from service.settings import Settings
from tests.conftest import read_lines, until, wait_for

LONG = (
    "A group of young men in colorful uniforms are playing a game of soccer on a large green field "
    "while a crowd of people watches from the stands behind them."
)


@pytest.fixture(scope="module")
def reference() -> Translator:
    """A second copy of the model for decoding alone (the engine's thread owns its own)."""
    return Translator.load("en-de", "cpu", num_threads=1)


@pytest.fixture()
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    config = getattr(request, "param", BatchingConfig())
    e = Engine(Translator.load("en-de", "cpu", num_threads=1), config, max_length=256)
    yield e
    e.close()


# These tests compare translations, not admission: however slow a busy host makes the decode rate the
# engine learns, the work queued ahead never refuses a request (the admission tests set their own limit).
UNREFUSED = math.inf

Job = tuple[float, list[int], DecodeOptions]  # (arrival in seconds, source ids, options)


def jobs(reference: Translator, n: int, seed: int) -> list[Job]:
    rng = random.Random(seed)
    texts = read_lines("test_2016_flickr.en.gz", 200)
    out = []
    for _ in range(n):
        beam = rng.choice([1, 2, 4, 4, 6])
        opts = DecodeOptions(
            beam_size=beam, num_hypotheses=min(beam, rng.choice([1, 2])), length_penalty=rng.choice([1.0, 1.0, 0.6])
        )
        out.append((rng.uniform(0, 0.6), reference.encode(rng.choice(texts)), opts))
    return out


async def send(engine: Engine, arrivals: list[Job]) -> list[list[Hypothesis]]:
    async def one(delay: float, ids: list[int], opts: DecodeOptions) -> list[Hypothesis]:
        await asyncio.sleep(delay)
        return (await engine.translate([ids], opts, timeout_s=60))[0]

    return list(await asyncio.gather(*(one(*job) for job in arrivals)))


@pytest.mark.parametrize(
    "engine",
    [
        BatchingConfig(max_queue_wait_s=UNREFUSED),
        BatchingConfig(mode="request", batch_wait_ms=2, max_queue_wait_s=UNREFUSED),
        BatchingConfig(mode="none", max_queue_wait_s=UNREFUSED),
    ],
    indirect=True,
    ids=["continuous", "request", "none"],
)
def test_staggered_mixed_requests_equal_decoding_each_alone(engine: Engine, reference: Translator) -> None:
    arrivals = jobs(reference, 40, seed=3)
    results = asyncio.run(send(engine, arrivals))
    for (_, ids, opts), got in zip(arrivals, results, strict=True):
        alone = reference.decode_batch([ids], opts)[0]
        assert [h.tokens for h in got] == [h.tokens for h in alone]
        assert [h.score for h in got] == pytest.approx([h.score for h in alone], abs=1e-4)
    stats = engine.stats
    assert stats.sentences == 40 and engine.active == 0 and engine.queued == 0
    if engine.config.mode == "continuous":
        assert stats.max_sentences > 1 and stats.steps > 0
        assert engine.step_runner.batch.rows == 0  # every slot free again
    if engine.config.mode == "none":
        assert stats.batches == 40 and stats.max_sentences == 1


def test_an_idle_engine_decodes_a_short_sentence_as_one_whole_batch_to_the_same_bits(
    engine: Engine, reference: Translator
) -> None:
    """One short sentence at a time skips the running batch's per-step bookkeeping (scheduler.alone): no
    decoder step of the running batch, and the very tokens and scores of decoding it alone; a long one
    still decodes in the running batch, which newcomers join."""
    opts = DecodeOptions(beam_size=4, num_hypotheses=2)
    short = [ids for ids in map(reference.encode, read_lines("test_2016_flickr.en.gz", 20)) if len(ids) <= 20][:6]
    for ids in short:
        got = asyncio.run(engine.translate([ids], opts, 60))[0]
        alone = reference.decode_batch([ids], opts)[0]
        assert [(h.tokens, h.score) for h in got] == [(h.tokens, h.score) for h in alone]
    assert engine.stats.steps == 0 and engine.stats.batches == 6
    asyncio.run(engine.translate([reference.encode(LONG)], opts, 60))
    assert engine.stats.steps > 0


def test_continuous_admits_newcomers_while_a_long_sentence_decodes(engine: Engine, reference: Translator) -> None:
    async def scenario() -> tuple[float, float]:
        long = asyncio.create_task(engine.translate([reference.encode(LONG)], DecodeOptions(beam_size=6), 60))
        await until(lambda: engine.stats.steps > 0, "the long sentence decoding")
        start = time.monotonic()
        await engine.translate([reference.encode("A dog.")], DecodeOptions(beam_size=1), 60)
        short_done = time.monotonic() - start
        await long
        return short_done, time.monotonic() - start

    short, long = asyncio.run(scenario())
    assert short < long  # the short request did not wait for the long one's batch to end
    assert engine.stats.max_sentences == 2


def test_a_request_s_timing_names_each_batch_its_sentences_shared(engine: Engine, reference: Translator) -> None:
    """What its trace is built from (service/tracing.py), gathered for a traced request only: a short sentence
    alone is one whole batch (no step count); sentences joining a running one are one admission, with the
    running sentence in its size, their encoder pass inside it and the decoder steps it took."""
    alone = RequestTiming(traced=True)
    asyncio.run(engine.translate([reference.encode("A dog.")], DecodeOptions(beam_size=4), 60, alone))
    ((whole,),) = [alone.batches]
    assert (whole.sentences, whole.batch, whole.steps, whole.encoded) == (1, 1, None, None)
    assert whole.enqueued <= whole.started <= whole.finished and whole.longest >= 2
    untraced = RequestTiming()  # a request no trace records: its times, no batches gathered
    asyncio.run(engine.translate([reference.encode("A cat.")], DecodeOptions(beam_size=4), 60, untraced))
    assert untraced.decode_s > 0 and untraced.batches == []

    async def scenario() -> RequestTiming:
        long = asyncio.create_task(engine.translate([reference.encode(LONG)], DecodeOptions(beam_size=4), 60))
        await until(lambda: engine.stats.steps > 0, "the long sentence decoding")
        timing = RequestTiming(traced=True)
        texts = read_lines("test_2016_flickr.en.gz", 3)
        await engine.translate([reference.encode(t) for t in texts], DecodeOptions(beam_size=4), 60, timing)
        await long
        return timing

    joined = asyncio.run(scenario())
    ((b,),) = [joined.batches]
    assert b.sentences == 3 and b.batch == 4  # the long sentence was decoding beside them
    assert b.encoded is not None and b.started <= b.encoded <= b.finished
    assert b.steps is not None and 1 <= b.steps <= b.longest + 1
    assert joined.decode_s == pytest.approx(b.finished - b.started)


def cancel_mid_decode(engine: Engine, ids: list[int], opts: DecodeOptions, decoding: Callable[[], bool]) -> None:
    """Send [ids, ids], cancel the request once `decoding()` says both decode, wait for the engine to idle."""

    async def scenario() -> None:
        task = asyncio.create_task(engine.translate([ids, ids], opts, 60))
        while not decoding() or engine.stats.steps < 3:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    # The request leaves `active` at once; a static pool frees its slots on the engine's next turn.
    pool = getattr(engine.step_runner, "pool", None)
    deadline = time.monotonic() + 10
    while (engine.active or (pool is not None and pool.busy)) and time.monotonic() < deadline:
        time.sleep(0.01)


def test_cancelled_request_frees_its_slots_mid_decode(engine: Engine, reference: Translator) -> None:
    ids = reference.encode(" ".join([LONG] * 3))
    opts = DecodeOptions(beam_size=8, max_decoding_length=256, max_length_ratio=None)
    full_steps = len(reference.decode_batch([ids], opts)[0][0].tokens) + 1
    cancel_mid_decode(engine, ids, opts, lambda: engine.step_runner.batch.rows >= 16)
    steps = engine.stats.steps
    time.sleep(0.2)
    assert engine.active == 0 and engine.step_runner.batch.rows == 0
    assert engine.stats.cancelled == 2 and engine.stats.steps == steps < full_steps


@pytest.mark.parametrize("engine", [BatchingConfig(max_batch_size=1, max_queue=2)], indirect=True)
def test_full_queue_refuses_and_deadline_fails_running_sentences(engine: Engine, reference: Translator) -> None:
    ids = reference.encode(LONG)

    async def scenario() -> None:
        busy = asyncio.create_task(engine.translate([ids], DecodeOptions(beam_size=8), 60))
        await until(lambda: engine.active == 1, "the busy sentence decoding")
        queued = asyncio.create_task(engine.translate([ids, ids], DecodeOptions(), 60))
        await until(lambda: engine.queued == 2, "two sentences queued")
        with pytest.raises(QueueFullError):
            await engine.translate([ids], DecodeOptions(), 60)
        with pytest.raises(RequestTooLargeError):
            await engine.translate([ids] * 3, DecodeOptions(), 60)
        await busy, await queued
        # admitted, then past its deadline mid-decode: 300 steps of 8 beams take far longer than 50 ms
        slow = DecodeOptions(beam_size=8, max_length_ratio=None, min_decoding_length=300)
        with pytest.raises(DeadlineExceededError):
            await engine.translate([ids], slow, 0.05)

    asyncio.run(scenario())
    assert engine.stats.rejected == 1 and engine.stats.expired == 1 and engine.active == 0


@pytest.mark.parametrize("engine", [BatchingConfig(max_queue_wait_s=UNREFUSED)], indirect=True)
def test_mode_switches_live_without_losing_queued_sentences(engine: Engine, reference: Translator) -> None:
    async def scenario() -> list[list[Hypothesis]]:
        first = asyncio.create_task(send(engine, jobs(reference, 10, seed=5)))
        await until(lambda: engine.queued or engine.active, "the first burst in the engine")
        engine.reconfigure(BatchingConfig(mode="request", batch_wait_ms=1, max_queue_wait_s=UNREFUSED))
        second = await send(engine, jobs(reference, 10, seed=6))
        engine.reconfigure(BatchingConfig(max_queue_wait_s=UNREFUSED))
        return [*(await first), *second]

    assert len(asyncio.run(scenario())) == 20 and engine.queued == 0 and engine.active == 0


@pytest.mark.parametrize(
    "engine",
    [BatchingConfig(mode="request", batch_wait_ms=1), BatchingConfig()],
    indirect=True,
    ids=["request", "continuous"],
)
def test_a_result_arrives_only_once_its_sentence_no_longer_counts_as_active(
    engine: Engine, reference: Translator
) -> None:
    """/v1/stats and the metrics read `active`: a caller holding its result must not find itself in it.
    A future's callback runs where its result is set, so it sees `active` as the caller first could."""
    seen: list[int] = []
    [item] = engine.submit([reference.encode(LONG)], DecodeOptions(beam_size=8), time.monotonic() + 60)
    item.future.add_done_callback(lambda _: seen.append(engine.active))
    assert not item.future.done()  # the callback runs on the engine's thread, when the result is set
    assert item.future.result(timeout=60)
    assert seen == [0] and engine.active == 0


@pytest.mark.parametrize("engine", [BatchingConfig(decode_slots=4)], indirect=True)
def test_engine_survives_a_failing_step_and_refuses_beams_past_its_slots(engine: Engine, reference: Translator) -> None:
    bad = [reference.model.cfg.vocab_size + 5, 0]  # an id past the embedding table: the encoder raises

    async def scenario() -> list[list[Hypothesis]]:
        with pytest.raises(IndexError):
            await engine.translate([bad], DecodeOptions(beam_size=2), 60)
        with pytest.raises(RequestTooLargeError, match="decode slots"):
            await engine.translate([reference.encode("A dog.")], DecodeOptions(beam_size=8), 60)
        return await engine.translate([reference.encode("A dog.")], DecodeOptions(beam_size=4), 60)

    good = asyncio.run(scenario())
    assert good[0][0].tokens == reference.decode_batch([reference.encode("A dog.")], DecodeOptions())[0][0].tokens
    assert engine.active == 0 and engine.step_runner.batch.rows == 0


def test_call_runs_on_the_engine_thread_between_steps_and_reports_failures(
    engine: Engine, reference: Translator
) -> None:
    async def scenario() -> tuple[str, list[list[Hypothesis]]]:
        long = asyncio.create_task(engine.translate([reference.encode(LONG)], DecodeOptions(beam_size=4), 60))
        while engine.stats.steps < 2:
            await asyncio.sleep(0.005)
        name = await asyncio.wrap_future(engine.call(lambda: threading.current_thread().name))
        assert not long.done()  # it did not wait for the long sentence to finish
        with pytest.raises(ZeroDivisionError):
            await asyncio.wrap_future(engine.call(lambda: 1 // 0))
        return name, [await long]

    name, results = asyncio.run(scenario())
    assert name == "beamserve-engine"
    alone = reference.decode_batch([reference.encode(LONG)], DecodeOptions(beam_size=4))[0]
    assert [h.tokens for h in results[0][0]] == [h.tokens for h in alone]  # the decode went on unharmed


@pytest.fixture()
def slot_engine() -> Iterator[Engine]:
    """Continuous mode on the static decode state (a GPU's default, Settings.uses_static_slots), here on the CPU."""
    e = Engine(
        Translator.load("en-de", "cpu", num_threads=1),
        BatchingConfig(decode_slots=32, max_queue_wait_s=UNREFUSED),
        max_length=256,
        static_slots=True,
    )
    yield e
    e.close()


def test_static_slots_serve_mixed_requests_as_each_decodes_alone(slot_engine: Engine, reference: Translator) -> None:
    arrivals = jobs(reference, 40, seed=5)  # beam 4 goes to the pool, beams 1, 2 and 6 beside it
    results = asyncio.run(send(slot_engine, arrivals))
    for (_, ids, opts), got in zip(arrivals, results, strict=True):
        alone = reference.decode_batch([ids], opts)[0]
        assert [h.tokens for h in got] == [h.tokens for h in alone], opts
        assert [h.score for h in got] == pytest.approx([h.score for h in alone], abs=1e-4)
    runner = slot_engine.step_runner
    assert runner.rows == 0 and runner.pool.busy == 0 and slot_engine.active == 0
    assert sum(o.beam_size == 4 for _, _, o in arrivals) > 5  # the pool was used


@pytest.mark.slow
def test_the_compiled_step_serves_mixed_requests_as_each_decodes_alone(reference: Translator) -> None:
    """Settings.compiled_step: the pool's step through inductor, every bucket compiled before the engine takes a
    request (one graph, some 40 s on two cores); then the same tokens as decoding alone, scores within rounding;
    a failed compiled step fails its sentences and the engine goes on without the pool."""
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    e = Engine(
        Translator.load("en-de", "cpu", num_threads=1),
        BatchingConfig(decode_slots=16, max_queue_wait_s=UNREFUSED),
        max_length=16,  # one target bucket, so few steps to prepare
        static_slots=True,
        compiled_step=True,
    )
    try:
        runner = e.step_runner
        assert isinstance(runner, SlotStepRunner) and runner.pool._compiled is not None
        compiled = counters["stats"]["unique_graphs"]
        assert compiled == graphs + 1  # prepare() compiled one graph for every bucket
        arrivals = [(d, ids[:30], o) for d, ids, o in jobs(reference, 16, seed=7)]
        arrivals = [(d, ids, dataclasses.replace(o, max_decoding_length=16)) for d, ids, o in arrivals]
        results = asyncio.run(send(e, arrivals))
        assert counters["stats"]["unique_graphs"] == compiled  # no bucket compiled while serving
        assert sum(o.beam_size == 4 for _, _, o in arrivals) >= 3  # the pool was used
        before = {name: t.clone() for name, t in runner.pool.state.tensors().items()}
        runner.pool.prepare()  # steps every bucket, the state put back as it was
        assert all(torch.equal(t, before[name]) for name, t in runner.pool.state.tensors().items())

        def broken(*_: object) -> None:
            raise RuntimeError("a compiled step failed")

        runner.pool._compiled = broken  # type: ignore[assignment]
        ids, opts = arrivals[0][1], DecodeOptions(max_decoding_length=16)  # the pool's beam
        with pytest.raises(RuntimeError, match="compiled step failed"):
            asyncio.run(e.translate([ids], opts, 60))
        again = asyncio.run(e.translate([ids], opts, 60))[0]  # on the InflightBatch, which needs no compiling
        assert not e.static_slots and not e.compiled_step and not hasattr(e.step_runner, "pool")
        assert [h.tokens for h in again] == [h.tokens for h in reference.decode_batch([ids], opts)[0]]
    finally:
        e.close()
    for (_, ids, opts), got in zip(arrivals, results, strict=True):
        alone = reference.decode_batch([ids], opts)[0]
        assert [h.tokens for h in got] == [h.tokens for h in alone], opts
        assert [h.score for h in got] == pytest.approx([h.score for h in alone], abs=1e-4)


@pytest.mark.cuda
def test_the_compiled_step_replayed_as_cuda_graphs_serves_mixed_requests_as_each_decodes_alone() -> None:
    """The GPU's compiled path: inductor's step captured as a graph per bucket, then replayed."""
    tr = Translator.load("en-de", "cuda", dtype="float32")
    config = BatchingConfig(decode_slots=64, max_queue_wait_s=UNREFUSED)
    e = Engine(tr, config, max_length=16, static_slots=True, compiled_step=True)
    try:
        arrivals = [(d, ids[:30], dataclasses.replace(o, max_decoding_length=16)) for d, ids, o in jobs(tr, 40, seed=5)]
        results = asyncio.run(send(e, arrivals))
        assert e.static_slots and e.step_runner.pool._graphs, "no graph replayed"  # type: ignore[union-attr]
    finally:
        e.close()
    for (_, ids, opts), got in zip(arrivals, results, strict=True):
        assert [h.tokens for h in got] == [h.tokens for h in tr.decode_batch([ids], opts)[0]], opts


def test_the_compiled_step_needs_the_static_decode_state(reference: Translator) -> None:
    with pytest.raises(ValueError, match="needs static_slots"):
        Engine(reference, BatchingConfig(), compiled_step=True)
    with pytest.raises(ValidationError, match="needs static_slots"):
        Settings(compiled_step=True, static_slots=False)
    assert Settings(compiled_step=True).uses_static_slots("cpu")


@pytest.mark.cuda
def test_static_slots_replaying_cuda_graphs_serve_mixed_requests_as_each_decodes_alone() -> None:
    """The served GPU path (Settings.static_slots on a GPU): graphs captured and replayed per bucket."""
    tr = Translator.load("en-de", "cuda", dtype="float32")
    e = Engine(tr, BatchingConfig(decode_slots=64, max_queue_wait_s=UNREFUSED), max_length=256, static_slots=True)
    try:
        arrivals = jobs(tr, 40, seed=5)
        results = asyncio.run(send(e, arrivals))
        assert e.static_slots and e.step_runner.pool._graphs, "no graph replayed"  # type: ignore[union-attr]
    finally:
        e.close()
    same = sum(
        [h.tokens for h in got] == [h.tokens for h in tr.decode_batch([ids], opts)[0]]
        for (_, ids, opts), got in zip(arrivals, results, strict=True)
    )
    assert same == len(arrivals)


def test_static_slots_free_a_cancelled_sentence_s_slot(slot_engine: Engine, reference: Translator) -> None:
    ids = reference.encode(" ".join([LONG] * 2))
    opts = DecodeOptions(beam_size=4, max_decoding_length=200, max_length_ratio=None)
    cancel_mid_decode(slot_engine, ids, opts, lambda: slot_engine.step_runner.pool.busy >= 2)
    assert slot_engine.active == 0 and slot_engine.step_runner.pool.busy == 0
    assert slot_engine.stats.cancelled == 2
    got = asyncio.run(slot_engine.translate([reference.encode("A dog.")], opts, 60))  # the slots serve again
    assert got[0][0].tokens == reference.decode_batch([reference.encode("A dog.")], opts)[0][0].tokens


@pytest.mark.parametrize("engine", [BatchingConfig(mode="request", batch_wait_ms=1)], indirect=True)
def test_health_reports_a_stalled_turn_and_a_stopped_engine(engine: Engine, reference: Translator) -> None:
    assert engine.health(stall_s=0.01) is None  # idle is healthy however long
    item = engine.submit([reference.encode(" ".join([LONG] * 2))], DecodeOptions(beam_size=8), time.monotonic() + 60)[0]
    wait_for(lambda: engine.active, "the batch decoding")
    # One batch is one long turn here: past stall_s into it, the engine reports a stall.
    wait_for(lambda: "no decoder turn" in (engine.health(stall_s=0.01) or ""), "a stalled turn reported")
    assert engine.health(stall_s=60) is None
    item.future.result(timeout=60)
    wait_for(lambda: engine.health(stall_s=0.01) is None, "healthy once idle")
    engine.close()
    assert engine.health(stall_s=60) == "the engine's thread has stopped"


def test_a_failing_static_decode_state_leaves_the_engine_on_today_s_path(
    slot_engine: Engine, reference: Translator, monkeypatch: pytest.MonkeyPatch
) -> None:
    from model.decode import slot_decoder

    def broken(*args: object, **kwargs: object) -> None:  # a fault injected into the pool's step
        raise RuntimeError("capture failed")

    monkeypatch.setattr(slot_decoder, "decode_step", broken)
    ids, opts = reference.encode("A dog runs in the snow."), DecodeOptions(beam_size=4)
    with pytest.raises(RuntimeError, match="static decode state failed"):
        asyncio.run(slot_engine.translate([ids], opts, 60))
    got = asyncio.run(slot_engine.translate([ids], opts, 60))  # served, on the InflightBatch path
    assert [h.tokens for h in got[0]] == [h.tokens for h in reference.decode_batch([ids], opts)[0]]
    assert not slot_engine.static_slots and not hasattr(slot_engine.step_runner, "pool")
