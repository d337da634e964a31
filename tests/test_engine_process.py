"""The engine in a process of its own (service/engine/engine_process.py, engine_host.py) with the real shipped
model: the same answers as the engine in this process, withdrawals reaching the host, refusals typed as the
engine raises them, and a host that dies or cannot load said so, never waited on."""

from __future__ import annotations

import asyncio
import math
import os
import signal
from collections.abc import Iterator

import pytest

from model import DecodeOptions, Translator
from service.batching import BatchingConfig
from service.engine import engine_process
from service.engine.engine import Engine
from service.engine.engine_host import HostSpec
from service.engine.engine_process import EngineProcess, EngineProcessError
from service.engine.scheduler import RequestTooLargeError
from tests.conftest import read_lines, until

# Translations, not admission: the work queued ahead never refuses a request here.
CONFIG = BatchingConfig(decode_slots=64, max_queue=256, max_queue_wait_s=math.inf)


def spec(path: str = "en-de", config: BatchingConfig = CONFIG) -> HostSpec:
    return HostSpec(path, "cpu", None, None, 1, config, 256, False, False, ("A dog runs.", None), 60.0)


@pytest.fixture(scope="module")
def reference() -> Translator:
    return Translator.load("en-de", "cpu", num_threads=1)


@pytest.fixture(scope="module")
def hosted() -> Iterator[EngineProcess]:
    e = EngineProcess(spec())
    yield e
    e.close()


async def working(engine: EngineProcess) -> bool:
    """Whether the host's engine holds sentences, queued or decoding, as of now."""
    await engine.refresh()
    return bool(engine.queued or engine.active)


def test_answers_are_the_in_process_engines_token_for_token(hosted: EngineProcess, reference: Translator) -> None:
    """Equal token ids and scores, one request at a time and many in flight, blank sources included."""
    texts = read_lines("test_2016_flickr.en.gz", 40)
    sources = [reference.encode(t) for t in texts]
    opts = [DecodeOptions(beam_size=4), DecodeOptions(beam_size=2, num_hypotheses=2), DecodeOptions(beam_size=1)]
    local = Engine(reference, CONFIG, max_length=256)
    try:

        async def run(engine: Engine | EngineProcess) -> list[object]:
            alone = [await engine.translate([s, []], opts[i % 3], 60) for i, s in enumerate(sources[:6])]
            together = await asyncio.gather(*(engine.translate([s], opts[i % 3], 60) for i, s in enumerate(sources)))
            return [alone, list(together)]

        assert asyncio.run(run(hosted)) == asyncio.run(run(local))
    finally:
        local.close()
    assert hosted.facts.digest == reference.digest  # the same model, computed with the same kernels
    assert hosted.health() is None


def test_alignment_is_the_translators(hosted: EngineProcess, reference: Translator) -> None:
    pairs = [("A man rides a bike.", "Ein Mann fährt Fahrrad."), ("", "Leer.")]
    got = asyncio.run(hosted.align(pairs, src_lang=None, tgt_lang=None))
    assert got == reference.align(pairs)


def test_a_cancelled_call_withdraws_its_sentences_in_the_host(hosted: EngineProcess, reference: Translator) -> None:
    ids = reference.encode(read_lines("test_2016_flickr.en.gz", 1)[0])
    before = hosted.stats.cancelled

    async def cancel_one() -> None:
        task = asyncio.ensure_future(hosted.translate([ids] * 30, DecodeOptions(beam_size=8), 60))
        await until(lambda: working(hosted), "the request in the host's engine")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The next answer carries the host's counts, the withdrawn sentences among them.
        await hosted.translate([ids], DecodeOptions(), 60)

    asyncio.run(cancel_one())
    assert hosted.stats.cancelled > before
    assert hosted.queued == 0 and hosted.active == 0


def test_a_refusal_reaches_the_caller_as_the_engine_raised_it(hosted: EngineProcess, reference: Translator) -> None:
    ids = reference.encode("A dog.")
    with pytest.raises(RequestTooLargeError, match="queues at most 256"):
        asyncio.run(hosted.translate([ids] * 257, DecodeOptions(), 60))


def test_a_host_that_dies_fails_its_calls_and_the_next_call_starts_another() -> None:
    e = EngineProcess(spec())
    ids = Translator.load("en-de", "cpu").encode(read_lines("test_2016_flickr.en.gz", 1)[0])
    assert engine_process.running() >= 1

    async def die_mid_call() -> tuple[object, object]:
        first = await e.translate([ids], DecodeOptions(), 60)
        task = asyncio.ensure_future(e.translate([ids] * 64, DecodeOptions(beam_size=8), 60))
        await until(lambda: working(e), "the request in the host's engine")
        os.kill(e.process.pid, signal.SIGKILL)
        with pytest.raises(EngineProcessError, match="exited"):  # replica_unavailable: the gateway asks again
            await asyncio.wait_for(task, 30)
        assert e.health() is None  # the next call starts another
        return first, await e.translate([ids], DecodeOptions(), 60)

    try:
        first, again = asyncio.run(die_mid_call())
        assert first == again and len(e.restarts) == 1
        assert e.stats.sentences >= 2  # the exited host's counts kept
    finally:
        e.close()


def test_calls_that_arrive_while_a_host_restarts_wait_for_it() -> None:
    e = EngineProcess(spec())
    ids = Translator.load("en-de", "cpu").encode("Two dogs play in the snow.")

    async def many_after_a_death() -> list[object]:
        alone = await e.translate([ids], DecodeOptions(), 60)
        os.kill(e.process.pid, signal.SIGKILL)
        e.process.wait()
        first = asyncio.ensure_future(e.translate([ids], DecodeOptions(), 60))  # starts the restart
        await until(lambda: e.restarts, "the restart under way")  # a new host is loading its model
        later = asyncio.gather(*(e.translate([ids], DecodeOptions(), 60) for _ in range(3)))
        return [alone, *await asyncio.wait_for(asyncio.gather(first, later), 60)]

    try:
        answers = asyncio.run(many_after_a_death())
        alone, first, later = answers
        assert first == alone and later == [alone] * 3 and len(e.restarts) == 1
    finally:
        e.close()


def test_past_its_restarts_a_dead_host_fails_the_health_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_process, "RESTARTS", 0)
    e = EngineProcess(spec())
    os.kill(e.process.pid, signal.SIGKILL)
    e.process.wait()
    with pytest.raises(EngineProcessError, match="not started again"):
        asyncio.run(e.translate([[5, 0]], DecodeOptions(), 60))
    assert e.health() == "the engine's process exited with code -9, after 0 restarts (not started again)"
    e.close()  # closing a dead host returns


def test_a_host_that_cannot_load_its_model_says_why(tmp_path: object) -> None:
    with pytest.raises(EngineProcessError, match="could not load its model"):
        EngineProcess(spec(path="/nonexistent/opus-mt-en-de"))


def test_closing_stops_the_host() -> None:
    e = EngineProcess(spec())
    e.close()
    assert e.process.poll() == 0
    assert e.health() == "the engine's process exited with code 0"
