"""Batching knobs deployed live to the shared server (runtime.deploy), and what a replica decoding one
sentence at a time with a short queue answers: the queue's bound as 503 with Retry-After (429 on
LibreTranslate's route), a missed deadline as 504, and a client that hangs up costing no decoding. The
tests share one deployment of the knobs; the server has its own back after them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from .conftest import SETTINGS, until, wait_for

# One sentence a batch, none waited for, at most six sentences queued.
KNOBS = {"max_queue": 6, "max_batch_size": 1, "batch_wait_ms": 0.0}
# One sentence, long enough that a few of them at beam 8 keep a replica busy for a while on any CPU.
LONGER = (
    "A group of young men in colorful uniforms are playing a game of soccer on a large green field "
    "while a crowd of people watches from the stands behind them, as a referee in a black shirt runs "
    "along the side of the field and watches the ball."
)
BUSY_DAYS = ("today", "yesterday", "on Monday", "on Tuesday", "on Wednesday")
# Every request past the cache: one test's translations must not answer the next test's from it.
UNCACHED = {"source": "en", "target": "de", "cache": False}
BUSY = {**UNCACHED, "texts": [f"{LONGER[:-1]} {day}." for day in BUSY_DAYS], "beam_size": 8}


@pytest.fixture(scope="module")
def one_at_a_time(server: str) -> Iterator[str]:
    """The shared server with KNOBS deployed; after the module, its own settings again."""
    from service import runtime

    runtime.deploy({**SETTINGS, **KNOBS})
    try:
        yield server
    finally:
        runtime.deploy(SETTINGS)
    config = httpx.get(f"{server}/v1/stats", timeout=60).json()["en-de"]["config"]
    assert (config["batch_wait_ms"], config["max_batch_size"]) == (
        SETTINGS["batch_wait_ms"],
        SETTINGS["max_batch_size"],
    )
    # decode_slots is left unset: the CPU replica's size; max_queue is set: as given.
    assert (config["decode_slots"], config["max_queue"]) == (256, SETTINGS["max_queue"])


@pytest.fixture()
def client(one_at_a_time: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=one_at_a_time, timeout=60) as c:
        yield c


async def holds(
    ac: httpx.AsyncClient, before: dict[str, int], sentences: int, request: asyncio.Task[httpx.Response]
) -> bool:
    """Whether en-de's engine holds this many sentences since `before`, decoding or queued; the request
    that brought the last of them must not have been answered yet."""
    now = (await ac.get("/v1/stats")).json()["en-de"]
    if now["batched_sentences"] - before["batched_sentences"] + now["queued"] >= sentences:
        return True
    assert not request.done(), f"answered before its sentences were seen: {request.result().text[:300]}"
    return False


def test_knobs_deployed_live_overload_is_503_with_retry_after_and_deadline_is_504(
    one_at_a_time: str, client: httpx.Client
) -> None:
    config = client.get("/v1/stats").json()["en-de"]["config"]
    assert (config["max_queue"], config["max_batch_size"], config["batch_wait_ms"]) == (6, 1, 0.0)
    # Seven distinct sentences (the gateway decodes a repeated one once).
    too_big = client.post("/v1/translate", json={"texts": list("abcdefg"), "source": "en", "target": "de"})
    assert too_big.status_code == 422 and "queues at most 6" in too_big.text
    before = client.get("/v1/stats").json()["en-de"]

    async def scenario() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=one_at_a_time, timeout=60) as ac:
            busy = asyncio.create_task(ac.post("/v1/translate", json=BUSY))
            # One of busy's sentences decodes, four wait (polled, not slept on, so a slow proxy hop or a
            # fast decoder cannot move the moment the queue holds them).
            await until(lambda: holds(ac, before, len(BUSY_DAYS), busy), "the busy request's sentences in the engine")
            three = {**UNCACHED, "texts": ["A dog.", "A cat.", "A bird."]}
            full = await ac.post("/v1/translate", json=three)
            # LibreTranslate's route says "slow down" as its clients expect: 429, its error shape.
            libre = await ac.post("/translate", json={"q": three["texts"], "source": "en", "target": "de"})
            assert libre.status_code == 429 and int(libre.headers["retry-after"]) >= 1, libre.text
            assert isinstance(libre.json()["error"], str) and libre.json()["code"] == "overloaded"
            late = await ac.post("/v1/translate", json={**UNCACHED, "texts": ["A dog."], "timeout_s": 0.05})
            return await busy, full, late

    busy, full, late = asyncio.run(scenario())
    assert busy.status_code == 200 and len(busy.json()["translations"]) == len(BUSY_DAYS)
    assert full.status_code == 503 and int(full.headers["retry-after"]) >= 1 and "(limit 6)" in full.text
    assert late.status_code == 504, late.text


def test_client_that_disconnects_stops_costing_compute(one_at_a_time: str, client: httpx.Client) -> None:
    def idle() -> bool:  # nothing left of an earlier test's requests, an expired one's drop included
        now = client.get("/v1/stats").json()["en-de"]
        return now["queued"] == 0 and now["active"] == 0

    wait_for(idle, "en-de's engine idle")
    before = client.get("/v1/stats").json()["en-de"]

    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=one_at_a_time, timeout=60) as ac:
            # Five long sentences at beam 8, one a batch: one decoding, the rest queued for seconds.
            busy = asyncio.create_task(ac.post("/v1/translate", json=BUSY))
            await until(lambda: holds(ac, before, len(BUSY_DAYS), busy), "the busy request's sentences in the engine")
            short = asyncio.create_task(ac.post("/v1/translate", json={**UNCACHED, "texts": ["A dog.", "A cat."]}))
            await until(lambda: holds(ac, before, len(BUSY_DAYS) + 2, short), "the short request's sentences queued")
            short.cancel()  # the client hangs up while its sentences wait
            with pytest.raises(asyncio.CancelledError):
                await short
            assert (await busy).status_code == 200

    asyncio.run(scenario())
    after = client.get("/v1/stats").json()["en-de"]
    assert after["cancelled"] - before["cancelled"] == 2  # both queued sentences dropped, never decoded
    assert after["batched_sentences"] - before["batched_sentences"] == len(BUSY_DAYS)  # only the busy request's
