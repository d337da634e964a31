"""The batching engine: a scheduler that decides which sentences decode together, and a runner that
computes them. No Ray here: the Serve replica owns one Engine per model.

Request-level dynamic batching: sentences from concurrent requests queue up; a batch is cut when its
padded cost (longest source x sentences x beams) would pass a token budget, when it holds
max_batch_size sentences, or when its oldest sentence has waited batch_wait_ms. Only sentences with
the same decoding options share a batch, and a batch is filled with the lengths closest to its
oldest sentence, so long and short inputs are not padded together needlessly.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import torch

from model.search import Hypothesis
from model.translator import DecodeOptions, Translator


class QueueFullError(Exception):
    """The queue has no room for this request: retry later (HTTP 503)."""

    def __init__(self, queued: int, limit: int, retry_after_s: float) -> None:
        super().__init__(f"queue full: {queued} sentences waiting (limit {limit}); retry in {retry_after_s:.0f}s")
        self.retry_after_s = retry_after_s


class RequestTooLargeError(ValueError):
    """The request has more sentences than the whole queue holds: it can never fit (HTTP 422)."""


class DeadlineExceededError(Exception):
    """The request's deadline passed before its sentences were decoded (HTTP 504)."""


@dataclass(frozen=True)
class BatchingConfig:
    max_batch_tokens: int = 6144
    max_batch_size: int = 64
    batch_wait_ms: float = 5.0
    max_queue: int = 512


@dataclass
class WorkItem:
    ids: list[int]
    opts: DecodeOptions
    deadline: float
    future: concurrent.futures.Future[list[Hypothesis]] = field(default_factory=concurrent.futures.Future)
    enqueued: float = field(default_factory=time.monotonic)
    seq: int = 0

    @property
    def cost(self) -> int:
        return len(self.ids) * self.opts.beam_size


@dataclass
class BatchStats:
    batches: int = 0
    sentences: int = 0
    max_sentences: int = 0  # the largest batch so far
    padded_tokens: int = 0
    real_tokens: int = 0
    rejected: int = 0
    expired: int = 0
    cancelled: int = 0


def batch_tokens(batch: list[WorkItem]) -> tuple[int, int]:
    """(padded, real) source tokens of a batch: longest x sentences, and the sum."""
    lengths = [len(it.ids) for it in batch]
    return max(lengths) * len(lengths), sum(lengths)


class Scheduler:
    """Decides admission and batch composition; never touches tensors."""

    def __init__(self, config: BatchingConfig) -> None:
        self.config = config
        self.queue: deque[WorkItem] = deque()
        self.stats = BatchStats()
        self._seq = itertools.count()

    def admit(self, items: list[WorkItem]) -> None:
        """Queue a request's sentences whole, or raise QueueFullError for all of them."""
        if len(self.queue) + len(items) > self.config.max_queue:
            self.stats.rejected += 1
            raise QueueFullError(len(self.queue), self.config.max_queue, retry_after_s=1.0)
        for item in items:
            item.seq = next(self._seq)
            self.queue.append(item)

    def next_batch(self, now: float) -> tuple[list[WorkItem] | None, float]:
        """The batch to run now, or None and how long to wait before asking again."""
        self._drop_dead(now)
        if not self.queue:
            return None, 1.0
        oldest = self.queue[0]
        same = [it for it in self.queue if it.opts == oldest.opts]
        waited = now - oldest.enqueued
        cfg = self.config
        if sum(it.cost for it in same) < cfg.max_batch_tokens and len(same) < cfg.max_batch_size:
            remaining = cfg.batch_wait_ms / 1000 - waited
            if remaining > 0:
                return None, remaining
        batch = self._fill(oldest, same)
        chosen = {it.seq for it in batch}
        self.queue = deque(it for it in self.queue if it.seq not in chosen)
        self._record(batch)
        return batch, 0.0

    def _fill(self, oldest: WorkItem, same: list[WorkItem]) -> list[WorkItem]:
        """The oldest sentence plus those of closest length while the padded cost fits the budget."""
        cfg = self.config
        batch = [oldest]
        longest = len(oldest.ids)
        for it in sorted(same[1:], key=lambda it: (abs(len(it.ids) - len(oldest.ids)), it.seq)):
            width = max(longest, len(it.ids))
            if len(batch) >= cfg.max_batch_size or width * (len(batch) + 1) * it.opts.beam_size > cfg.max_batch_tokens:
                break
            batch.append(it)
            longest = width
        return batch

    def _drop_dead(self, now: float) -> None:
        alive: deque[WorkItem] = deque()
        for it in self.queue:
            if it.future.cancelled():
                self.stats.cancelled += 1
            elif now > it.deadline:
                self.stats.expired += 1
                it.future.set_exception(DeadlineExceededError("deadline passed while queued"))
            else:
                alive.append(it)
        self.queue = alive

    def _record(self, batch: list[WorkItem]) -> None:
        s = self.stats
        s.batches += 1
        s.sentences += len(batch)
        s.max_sentences = max(s.max_sentences, len(batch))
        padded, real = batch_tokens(batch)
        s.padded_tokens += padded
        s.real_tokens += real


class EngineObserver(Protocol):
    """Receives what the engine does (service/metrics.py records it); called from the engine thread."""

    def on_batch(self, sentences: int, padded: int, real: int, waits: list[float]) -> None: ...

    def on_generated(self, tokens: int) -> None: ...

    def sync(self, stats: BatchStats, queued: int, active: int, gpu_bytes: int) -> None: ...


class Runner:
    """Computes a batch with the model; never decides anything."""

    def __init__(self, translator: Translator) -> None:
        self.translator = translator

    def run(self, batch: list[WorkItem]) -> int:
        """Decode the batch and resolve its futures; returns the tokens generated (best hypotheses)."""
        live = [it for it in batch if it.future.set_running_or_notify_cancel()]
        if not live:
            return 0
        try:
            results = self.translator.decode_batch([it.ids for it in live], live[0].opts)
        except Exception as exc:  # a failed batch fails its requests, never the engine
            for it in live:
                it.future.set_exception(exc)
            return 0
        for it, hyps in zip(live, results, strict=True):
            it.future.set_result(hyps)
        return sum(len(h[0].tokens) + 1 for h in results if h)


class Engine:
    """One model's queue, scheduler and runner; the runner works in its own thread."""

    def __init__(self, translator: Translator, config: BatchingConfig, observer: EngineObserver | None = None) -> None:
        self.translator = translator
        self.observer = observer
        self.scheduler = Scheduler(config)
        self.runner = Runner(translator)
        self._cv = threading.Condition()
        self._active = 0
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="beamserve-engine", daemon=True)
        self._thread.start()

    @property
    def queued(self) -> int:
        return len(self.scheduler.queue)

    @property
    def active(self) -> int:
        """Sentences being decoded right now."""
        return self._active

    @property
    def stats(self) -> BatchStats:
        return self.scheduler.stats

    def reconfigure(self, config: BatchingConfig) -> None:
        with self._cv:
            self.scheduler.config = config
            self._cv.notify()

    def submit(self, sources: list[list[int]], opts: DecodeOptions, deadline: float) -> list[WorkItem]:
        """Queue the non-empty sources of one request (all or none)."""
        items = [WorkItem(ids, opts, deadline) for ids in sources if ids]
        limit = self.scheduler.config.max_queue
        if len(items) > limit:
            raise RequestTooLargeError(f"request has {len(items)} sentences; this server queues at most {limit}")
        with self._cv:
            self.scheduler.admit(items)
            self._cv.notify()
        return items

    async def translate(
        self, sources: list[list[int]], opts: DecodeOptions, timeout_s: float,
    ) -> list[list[Hypothesis]]:
        """Decode one request's sources; cancelling the awaiting task withdraws its queued sentences."""
        live = [i for i, ids in enumerate(sources) if ids]
        items = self.submit(sources, opts, time.monotonic() + timeout_s)  # one per live source, in order
        futures = {i: item.future for i, item in zip(live, items, strict=True)}
        try:
            done = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures.values()))
        except BaseException:
            for f in futures.values():
                f.cancel()
            raise
        results = dict(zip(futures, done, strict=True))
        return [results.get(i, [Hypothesis([], 0.0)]) for i in range(len(sources))]

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while True:
                    if self._stop:
                        return
                    now = time.monotonic()
                    batch, wait = self.scheduler.next_batch(now)
                    if batch is not None:
                        self._active = len(batch)
                        break
                    self._sync()
                    self._cv.wait(timeout=wait)
            if self.observer is not None:
                self.observer.on_batch(len(batch), *batch_tokens(batch), [now - it.enqueued for it in batch])
                self._sync()
            generated = self.runner.run(batch)
            with self._cv:
                self._active = 0
            if self.observer is not None:
                self.observer.on_generated(generated)
                self._sync()

    def _sync(self) -> None:
        if self.observer is not None:
            device = self.translator.device
            gpu = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
            self.observer.sync(self.stats, self.queued, self._active, gpu)
