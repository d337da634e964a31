"""The batching engine: one model's queue, scheduler and runner. No Ray here: the Serve replica owns
one Engine per model, and the engine's thread owns the model.

The loop reads schedule -> execute -> update. In continuous mode (the default) it turns once per
decoder step: the scheduler admits queued sentences and drops withdrawn ones, the runner encodes the
newcomers and runs one decoder step for every sentence in flight, and finished sentences complete
their requests at once, freeing their rows for the next step. In request mode a turn is a whole
batch decoded to its end (the classic dynamic batching, kept as a baseline and a fallback).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple, Protocol, TypeVar

import torch

from model.decode.align import Link
from model.decode.confidence import ScoringResult
from model.decode.inflight import InflightBatch
from model.decode.search import Hypothesis
from model.options import DecodeOptions
from model.translator import Translator
from service import tracing
from service.batching import BatchingConfig
from service.engine.scheduler import (
    BatchStats,
    ContinuousScheduler,
    DeadlineExceededError,
    Plan,
    QueueFullError,
    RequestScheduler,
    RequestTooLargeError,
    Throughput,
    WorkItem,
    batch_tokens,
    mark_encoded,
)
from service.engine.slot_runner import SlotPoolError, SlotStepRunner

logger = logging.getLogger(__name__)

__all__ = [
    "DeadlineExceededError",
    "Engine",
    "QueueFullError",
    "RequestTiming",
    "RequestTooLargeError",
]

R = TypeVar("R")


class BatchTiming(NamedTuple):
    """Those of a request's sentences that began decoding together (one admission to the running batch, or
    one whole batch), for its trace (service/tracing.py). Times are monotonic seconds."""

    enqueued: float  # the first of them queued
    started: float
    encoded: float | None  # their encoder pass ended (continuous batching, where it runs apart)
    finished: float  # the last of them done
    sentences: int  # the request's
    batch: int  # sentences decoding together as they began
    steps: int | None  # decoder steps from their start to the last one's end (continuous batching)
    longest: int  # tokens of the longest of their translations


@dataclass
class RequestTiming:
    """One request's time in the engine: the longest any of its sentences waited to start decoding,
    from the first of them starting to the last finishing, and, for a request being traced, its sentences'
    batches."""

    queue_wait_s: float = 0.0
    decode_s: float = 0.0
    traced: bool = False  # its batches wanted: the request's trace records them (tracing.recording())
    batches: list[BatchTiming] = field(default_factory=list)

    def measure(self, items: list[WorkItem]) -> None:
        if not items:  # a request of blank texts: nothing waited or decoded
            return
        starts = [it.started if it.started is not None else it.enqueued for it in items]
        ends = [it.finished if it.finished is not None else s for it, s in zip(items, starts, strict=True)]
        self.queue_wait_s = max(s - it.enqueued for it, s in zip(items, starts, strict=True))
        self.decode_s = max(ends) - min(starts)
        if not self.traced:
            return
        together: dict[float, list[tuple[WorkItem, float]]] = {}
        for it, end in zip(items, ends, strict=True):
            if it.started is not None:
                together.setdefault(it.started, []).append((it, end))
        self.batches = [
            BatchTiming(
                enqueued=min(it.enqueued for it, _ in group),
                started=started,
                encoded=max((it.encoded for it, _ in group if it.encoded is not None), default=None),
                finished=max(end for _, end in group),
                sentences=len(group),
                batch=group[0][0].batch,
                steps=max((s for it, _ in group if (s := it.steps()) is not None), default=None),
                longest=max(it.tokens for it, _ in group),
            )
            for started, group in together.items()
        ]

    def trace(self) -> None:
        """The request's time in the engine as spans under the current one (service/tracing.py): for each group
        of its sentences that began decoding together, the wait in the queue, the encoder's pass (continuous
        batching, where it runs apart) and the decoding, with the batch's size and steps."""
        for b in self.batches:
            tracing.recorded("queue", b.enqueued, b.started, {"beamserve.sentences": b.sentences})
            decoding = b.started
            if b.encoded is not None:
                tracing.recorded("encode", b.started, b.encoded, {"beamserve.sentences": b.sentences})
                decoding = b.encoded
            attributes = {
                "beamserve.batch.kind": "continuous" if b.steps is not None else "whole",
                "beamserve.batch.sentences": b.batch,
                "beamserve.sentences": b.sentences,
                "beamserve.output_tokens": b.longest,
            }
            if b.steps is not None:
                attributes["beamserve.batch.steps"] = b.steps
            tracing.recorded("decode", decoding, b.finished, attributes)


class EngineObserver(Protocol):
    """Receives what the engine does (service/metrics.py records it); called from the engine thread."""

    def on_batch(self, sentences: int, padded: int, real: int, waits: list[float]) -> None: ...

    def on_step(self, rows: int) -> None: ...

    def on_generated(self, tokens: int) -> None: ...

    def sync(
        self, stats: BatchStats, queued: int, active: int, gpu_bytes: int, *, idle: bool = False, due: bool = False
    ) -> float | None:
        """Idle: how long until what it holds must be recorded (the engine waits no longer), or None. Due: record
        it now (the reports of an engine in its own process come at most as often as they are recorded)."""
        ...


def _run_job(fn: Callable[[], Any], future: concurrent.futures.Future[Any]) -> None:
    if not future.set_running_or_notify_cancel():  # cancelled while queued
        return
    try:
        future.set_result(fn())
    except Exception as exc:
        future.set_exception(exc)


def _mark_started(
    observer: EngineObserver | None, items: list[WorkItem], now: float, batch: int, step: int | None = None
) -> None:
    """Mark items as started decoding now, beside `batch` sentences in all (at the engine's decoder step
    `step`, in continuous batching), and tell the observer of their batch."""
    for it in items:
        it.started, it.batch, it.first_step = now, batch, step
    if observer is not None:
        observer.on_batch(len(items), *batch_tokens(items), [now - it.enqueued for it in items])


def _resolve(item: WorkItem, hyps: list[Hypothesis], step: int | None = None) -> int:
    """Complete an item's request (at the engine's decoder step `step`, in continuous batching); returns the
    tokens its best hypothesis generated (</s> included)."""
    item.finished, item.last_step = time.monotonic(), step
    item.tokens = len(hyps[0].tokens) + 1 if hyps else 0
    try:
        item.future.set_result(hyps)
    except concurrent.futures.InvalidStateError:  # withdrawn while its last step ran
        return 0
    return item.tokens


class Request:
    """One request's sentences, queued in the engine (all or none: RequestTooLargeError, QueueFullError): `future`
    resolves, in the thread that finishes the last, to each source's n-best (a blank source's, an empty
    hypothesis), or fails with the first failure, the others then withdrawn."""

    def __init__(self, engine: Engine, sources: list[list[int]], opts: DecodeOptions, timeout_s: float) -> None:
        self.engine = engine
        self.items = engine.submit(sources, opts, time.monotonic() + timeout_s)  # one per non-blank source, in order
        self.live = [i for i, ids in enumerate(sources) if ids]
        self.size = len(sources)
        self.future: concurrent.futures.Future[list[list[Hypothesis]]] = concurrent.futures.Future()
        self._left = len(self.items)
        self._lock = threading.Lock()
        if not self.items:
            self.future.set_result(self._answers())
        for item in self.items:
            item.future.add_done_callback(self._settled)

    def _answers(self) -> list[list[Hypothesis]]:
        done = {i: item.future.result() for i, item in zip(self.live, self.items, strict=True)}
        return [done.get(i, [Hypothesis([], 0.0)]) for i in range(self.size)]

    def _settled(self, item: concurrent.futures.Future[list[Hypothesis]]) -> None:
        with self._lock:
            self._left -= 1
            if self.future.done() or item.cancelled():  # cancel() settles a withdrawn request
                return
            failure = item.exception()
            if failure is None:
                if self._left == 0:
                    self.future.set_result(self._answers())
                return
            self.future.set_exception(failure)
        self.cancel()  # one failed sentence fails its request: the others need not decode

    def cancel(self) -> None:
        """Withdraw the request's sentences, queued or decoding."""
        self.future.cancel()
        for item in self.items:
            item.future.cancel()
        self.engine.wake()


class BatchRunner:
    """Request mode: computes a whole batch with the model; never decides anything."""

    def __init__(self, translator: Translator) -> None:
        self.translator = translator

    def run(self, batch: list[WorkItem]) -> tuple[list[WorkItem], list[list[Hypothesis]] | Exception]:
        """Decode the batch's live items (withdrawn ones are skipped); returns them and their n-best
        lists, or the exception that failed the batch. The engine resolves the futures."""
        live = [it for it in batch if it.future.set_running_or_notify_cancel()]
        if not live:
            return live, []
        try:
            return live, self.translator.decode_batch([it.ids for it in live], live[0].opts)
        except Exception as exc:  # a failed batch fails its requests, never the engine
            logger.exception("a batch of %d sentences failed (beam_size %d)", len(live), live[0].opts.beam_size)
            return live, exc


class StepRunner:
    """Continuous mode: applies a plan to the in-flight batch and runs one decoder step."""

    def __init__(self, translator: Translator, slots: int, max_length: int) -> None:
        self.translator = translator
        self.batch = InflightBatch(translator.model, rows=slots, max_length=max_length)

    def execute(self, plan: Plan) -> tuple[int, list[tuple[int, list[Hypothesis]]]]:
        """Drop leavers, encode joiners (grouped by options), step.

        Returns the rows the decoder step ran (0: nothing left to decode) and (seq, n-best) of the
        sentences that finished.
        """
        tr = self.translator
        if plan.leave:
            self.batch.remove({it.seq for it in plan.leave})
        groups: dict[DecodeOptions, list[WorkItem]] = {}
        for it in plan.join:
            groups.setdefault(it.opts, []).append(it)
        for opts, items in groups.items():
            sources = [it.ids for it in items]
            caps = tr.max_lengths(sources, opts).clamp(max=self.batch.max_length)  # never past the buffers
            self.batch.add([it.seq for it in items], sources, caps.tolist(), tr.search_options(opts))
        mark_encoded(plan.join)
        rows = self.batch.rows
        return rows, [(int(seq), hyps) for seq, hyps in self.batch.step()]  # type: ignore[call-overload]


class Engine:
    """One model's queue, scheduler and runner; the runner works in its own thread."""

    def __init__(
        self,
        translator: Translator,
        config: BatchingConfig,
        observer: EngineObserver | None = None,
        *,
        max_length: int | None = None,
        static_slots: bool = False,
        compiled_step: bool = False,
    ) -> None:
        """max_length: the longest output any request may ask for (sizes continuous mode's buffers); static_slots:
        continuous mode on the static decode state (service/engine/slot_runner.py; CUDA graphs on a GPU), its step
        compiled by inductor where compiled_step (every bucket before the constructor returns)."""
        self.translator = translator
        self.static_slots = static_slots
        self.compiled_step = compiled_step
        self.max_length = min(max_length or 10**9, translator.model.cfg.max_position_embeddings)
        self.observer = observer
        self.config = config
        self.requests = RequestScheduler(config)
        self.continuous = ContinuousScheduler(config)
        self.stats = BatchStats()
        self.requests.stats = self.continuous.stats = self.stats  # one set of counts whatever the mode
        self.requests.throughput = self.continuous.throughput = Throughput()  # and one decoding rate
        self.batch_runner = BatchRunner(translator)
        self.step_runner: StepRunner | SlotStepRunner
        self._cv = threading.Condition()
        self._jobs: deque[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = deque()  # call()'s
        self._active = 0
        self._stop = False
        self._last_turn = time.monotonic()  # when the loop last finished a unit of work (health)
        # All of the model's work, the step runner's buffers included, happens on the engine's thread:
        # a second thread running parallel torch ops would start a second OpenMP team (see Translator.load).
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="beamserve-engine", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            raise self._start_error

    @property
    def scheduler(self) -> RequestScheduler | ContinuousScheduler:  # the configured mode's: sentences queue in it
        return self.continuous if self.config.mode == "continuous" else self.requests

    @property
    def queued(self) -> int:
        return len(self.requests.queue) + len(self.continuous.queue)

    @property
    def active(self) -> int:
        """Sentences being decoded right now."""
        return self._active

    def reconfigure(self, config: BatchingConfig) -> None:
        """Apply new knobs live; queued sentences move to the new mode's queue, running ones finish."""
        with self._cv:
            old = self.scheduler
            self.config = self.requests.config = self.continuous.config = config
            if self.scheduler is not old:
                self.scheduler.queue.extend(old.queue)
                old.queue.clear()
            self._cv.notify()

    def submit(self, sources: list[list[int]], opts: DecodeOptions, deadline: float) -> list[WorkItem]:
        """Queue the non-empty sources of one request (all or none)."""
        items = [WorkItem(ids, opts, deadline) for ids in sources if ids]
        _refuse_too_large(len(items), opts.beam_size, self.config)
        with self._cv:
            self.scheduler.admit(items)
            self._cv.notify()
        return items

    async def translate(
        self, sources: list[list[int]], opts: DecodeOptions, timeout_s: float, timing: RequestTiming | None = None
    ) -> list[list[Hypothesis]]:
        """Decode one request's sources; cancelling the awaiting task withdraws its sentences, queued or
        running. `timing`, when given, is filled in with the request's queue wait and decode time."""
        request = Request(self, sources, opts, timeout_s)
        try:
            hyps = await asyncio.wrap_future(request.future)
        except BaseException:
            request.cancel()
            raise
        if timing is not None:
            timing.measure(request.items)
        return hyps

    def wake(self) -> None:  # withdrawn sentences are dropped at the loop's next turn
        with self._cv:
            self._cv.notify()

    def call(self, fn: Callable[[], R]) -> concurrent.futures.Future[R]:
        """fn on the engine's thread between two turns (alignment: no second thread runs torch ops); its result
        or exception goes to the future."""
        future: concurrent.futures.Future[R] = concurrent.futures.Future()
        with self._cv:
            self._jobs.append((fn, future))
            self._cv.notify()
        return future

    async def align(
        self, pairs: list[tuple[str, str]], *, src_lang: str | None, tgt_lang: str | None
    ) -> list[list[Link]]:
        """Translator.align on the engine's thread, between two turns."""
        align = partial(self.translator.align, pairs, src_lang=src_lang, tgt_lang=tgt_lang)
        return await asyncio.wrap_future(self.call(align))

    async def score(
        self, pairs: list[tuple[str, str]], *, src_lang: str | None, tgt_lang: str | None
    ) -> list[ScoringResult]:
        """Translator.score on the engine's thread, between two turns."""
        sources, targets = [s for s, _ in pairs], [t for _, t in pairs]
        score = partial(self.translator.score, sources, targets, src_lang=src_lang, tgt_lang=tgt_lang)
        return await asyncio.wrap_future(self.call(score))

    def health(self, stall_s: float) -> str | None:
        """Why the engine cannot serve, or None: its thread has died, or work has waited stall_s seconds
        without the loop finishing a turn (a wedged step)."""
        if not self._thread.is_alive():
            return "the engine's thread has stopped"
        busy = self.queued or self._active or self._jobs
        idle_for = time.monotonic() - self._last_turn
        if busy and idle_for > stall_s:
            return f"no decoder turn for {idle_for:.0f}s with {self.queued} sentences queued, {self._active} decoding"
        return None

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        try:
            self.step_runner = self._fresh_runner()
        except BaseException as exc:  # raised again by __init__
            self._start_error = exc
            return
        finally:
            self._started.set()
        self._loop()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while True:
                    if self._stop:
                        return
                    turn, wait = self._schedule(time.monotonic())
                    if turn is not None:
                        break
                    self._last_turn = time.monotonic()  # idle is not stalled
                    self._cv.wait(timeout=wait)
            try:
                turn()
            except Exception as exc:  # a failure fails the sentences in flight, never the engine
                self._fail_running(exc)
            self._last_turn = time.monotonic()
            self.stats.cpu_s = time.thread_time()
            self._sync()

    def _schedule(self, now: float) -> tuple[Callable[[], None] | None, float]:
        """The next unit of work, run outside the lock; or None and how long to wait for some."""
        if self._jobs:
            fn, future = self._jobs.popleft()
            return (lambda: _run_job(fn, future)), 0.0
        if not self.static_slots and (alone := self.continuous.alone(now)):
            self._active = len(alone)
            _mark_started(self.observer, alone, now, len(alone))
            return (lambda: self._run_batch(alone)), 0.0
        if self.continuous.running or self.continuous.queue:
            if not self.continuous.running and self.step_runner.batch.capacity != self.config.decode_slots:
                self.step_runner = self._fresh_runner()  # resize the pool while it is empty
            plan = self.continuous.schedule(now, self.step_runner.batch.capacity)
            self._active = len(self.continuous.running)
            if plan.join:
                _mark_started(self.observer, plan.join, now, self._active, self.stats.steps)
            return (lambda: self._step(plan)), 0.0
        batch, wait = self.requests.next_batch(now)
        if batch is None:
            self._active = 0
            due = self._sync(idle=True)
            return None, wait if due is None else min(wait, due)
        self._active = len(batch)
        _mark_started(self.observer, batch, now, len(batch))
        return (lambda: self._run_batch(batch)), 0.0

    def _step(self, plan: Plan) -> None:
        """execute -> update for one decoder step."""
        start = time.monotonic()
        rows, finished = self.step_runner.execute(plan)
        busy = time.monotonic() - start
        with self._cv:
            self.stats.steps += rows > 0  # a turn that only dropped leavers ran no decoder step
            done = [(self.continuous.finish(seq), hyps) for seq, hyps in finished]
            self.continuous.throughput.record(sum(item.cost for item, _ in done), busy, start + busy)
            self._active = len(self.continuous.running)  # counted before any caller sees its result
            generated = sum(_resolve(item, hyps, self.stats.steps) for item, hyps in done)
        if self.observer is not None and rows:
            self.observer.on_step(rows)
            self.observer.on_generated(generated)

    def _fail_running(self, exc: Exception) -> None:
        """Fail every sentence in flight and start from a fresh pool (its state may be half-updated);
        after a failure of the static decode state, on the InflightBatch path alone."""
        if isinstance(exc, SlotPoolError):
            self.static_slots = self.compiled_step = False
        logger.error(
            "a decoder step failed; failing the %d sentences in flight", len(self.continuous.running), exc_info=exc
        )
        with self._cv:
            futures = [self.continuous.finish(seq).future for seq in list(self.continuous.running)]
            self._active = 0
            for future in futures:
                if not future.done():
                    future.set_exception(exc)
        self.step_runner = self._fresh_runner()

    def _run_batch(self, batch: list[WorkItem]) -> None:
        start = time.monotonic()
        live, results = self.batch_runner.run(batch)
        busy = time.monotonic() - start
        generated = 0
        with self._cv:
            self._active = 0  # before any caller sees its result, as in _step
            if isinstance(results, Exception):
                for it in live:
                    it.future.set_exception(results)
            else:  # a sentence whose deadline passed while its batch decoded fails, as in the running batch
                ends = start + busy
                answered = [(it, h) for it, h in zip(live, results, strict=True) if not self.requests.expired(it, ends)]
                generated = sum(_resolve(it, hyps) for it, hyps in answered)
                self.requests.throughput.record(sum(it.cost for it in live), busy, ends)
        if self.observer is not None:
            self.observer.on_generated(generated)

    def _fresh_runner(self) -> StepRunner | SlotStepRunner:
        return step_runner_for(self.translator, self.config, self.max_length, self.static_slots, self.compiled_step)

    def _sync(self, *, idle: bool = False) -> float | None:
        if self.observer is None:
            return None
        device = self.translator.device
        gpu = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        return self.observer.sync(self.stats, self.queued, self._active, gpu, idle=idle)


def _refuse_too_large(sentences: int, beam_size: int, config: BatchingConfig) -> None:
    """RequestTooLargeError for a request that no wait would let in."""
    if sentences > config.max_queue:
        raise RequestTooLargeError(f"request has {sentences} sentences; this server queues at most {config.max_queue}")
    if config.mode == "continuous" and beam_size > config.decode_slots:
        raise RequestTooLargeError(
            f"beam_size {beam_size} is more than the {config.decode_slots} decode slots this server has"
        )


def step_runner_for(
    translator: Translator, config: BatchingConfig, max_length: int, static_slots: bool, compiled: bool = False
) -> StepRunner | SlotStepRunner:
    """Continuous mode's runner: on the static decode state (CUDA graphs replayed on a GPU; its step compiled
    where `compiled`), or InflightBatch."""
    if compiled and not static_slots:
        raise ValueError("compiled_step compiles the static decode state's step: it needs static_slots")
    if static_slots:
        graphs = translator.device.type == "cuda"
        beams = DecodeOptions().beam_size  # the pool hosts the default beam; other beams decode beside it
        return SlotStepRunner(
            translator, config.decode_slots, max_length, beams=beams, graphs=graphs, compiled=compiled
        )
    return StepRunner(translator, config.decode_slots, max_length)


def warm_up(
    engine: Engine, sources: list[list[int]], beam_sizes: tuple[int, ...] = (1, 4), timeout_s: float = 300.0
) -> None:
    """Decode `sources` once per beam size through the engine (its first calls allocate and pick kernels),
    blocking until done; on the engine's thread, as every decode is."""
    for beam in beam_sizes:
        items = engine.submit(sources, DecodeOptions(beam_size=beam), time.monotonic() + timeout_s)
        for item in items:
            item.future.result(timeout=timeout_s)
