"""The schedulers: they decide which sentences decode when, and never touch tensors.

Two policies share one bounded queue:
- `ContinuousScheduler` (the default, mode "continuous"): before every decoder step, admits queued
  sentences into the running batch while hypothesis rows (decode slots), the sentence cap and the
  token budget allow (the oldest first, then those closest to it in length), and takes out sentences
  whose client left or whose deadline passed.
- `RequestScheduler` (mode "request", and "none" = one sentence at a time): cuts whole batches that
  then run to completion; a batch is cut when its padded cost (longest source x sentences x beams)
  would pass the token budget, at max_batch_size sentences, or when its oldest sentence has waited
  batch_wait_ms. Only sentences with the same options share a batch, filled with the lengths closest
  to its oldest sentence.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from model.options import DecodeOptions, max_length
from service.batching import BatchingConfig
from service.errors import CodedError

if TYPE_CHECKING:  # the gateway imports this module's errors, and must not load torch
    from model.decode.search import Hypothesis

# Admission looks at this many of the oldest queued sentences: enough to fill the GPU sizes' 256
# sentences, and a bounded sort at each admission however long a backlog grows (4,096 on a GPU).
ADMISSION_WINDOW = 256
# An idle engine decodes a queue of at most alone_max_sentences sentences of one set of options, each capped at
# ALONE_MAX_STEPS generated tokens, as one whole batch (ContinuousScheduler.alone): one sentence alone then
# costs what Translator.translate costs, without the running batch's per-step bookkeeping
# (docs/benchmarks.md, "One sentence at a time"). A newcomer waits for that batch to end, at most
# ALONE_MAX_STEPS steps of a few sentences, where it would wait max_waiting_steps to join a running batch;
# a longer sentence decodes in the running batch, which newcomers join.
ALONE_MAX_STEPS = 64
_SEQ = itertools.count()  # one numbering for every queue: items keep their number when moved between modes


class QueueFullError(CodedError):
    """The queue has no room for this request: retry later."""

    code = "overloaded"

    def __init__(self, queued: int, limit: int, retry_after_s: float, wait_s: float | None = None) -> None:
        why = (
            f"about {wait_s:.1f}s of work queued ahead"
            if wait_s is not None
            else f"{queued} sentences waiting (limit {limit})"
        )
        super().__init__(f"overloaded: {why}; retry in {retry_after_s:.0f}s")
        self.queued, self.limit, self.retry_after_s, self.wait_s = queued, limit, retry_after_s, wait_s

    def __reduce__(self) -> tuple[type[QueueFullError], tuple[int, int, float | None, float | None]]:
        # Raised in a replica, read in the gateway.
        return type(self), (self.queued, self.limit, self.retry_after_s, self.wait_s)


class RequestTooLargeError(CodedError, ValueError):
    """The request has more sentences than the whole queue holds: it can never fit."""

    code = "too_many_texts"


class DeadlineExceededError(CodedError):
    """The request's deadline passed before its sentences were decoded."""

    code = "timeout"


@dataclass
class WorkItem:
    ids: list[int]
    opts: DecodeOptions
    deadline: float
    future: concurrent.futures.Future[list[Hypothesis]] = field(default_factory=concurrent.futures.Future)
    enqueued: float = field(default_factory=time.monotonic)
    seq: int = field(default_factory=lambda: next(_SEQ))
    started: float | None = None  # when it began decoding (monotonic)
    finished: float | None = None  # when its translation was handed back
    # For its request's trace (service/tracing.py): when its encoder pass ended (continuous batching), the
    # sentences decoding beside it as it began, the engine's decoder step count as it began and as it finished
    # (continuous batching), its best translation's tokens.
    encoded: float | None = None
    batch: int = 0
    first_step: int | None = None
    last_step: int | None = None
    tokens: int = 0

    def steps(self) -> int | None:
        """The decoder steps it took part in (continuous batching, decoded to its end), else None."""
        if self.first_step is None or self.last_step is None:
            return None
        return self.last_step - self.first_step

    @property
    def cost(self) -> int:
        return len(self.ids) * self.opts.beam_size


@dataclass
class BatchStats:
    batches: int = 0  # request mode: batches run; continuous mode: admissions (sentences joining together)
    sentences: int = 0  # sentences started
    max_sentences: int = 0  # the most sentences decoding at once
    padded_tokens: int = 0
    real_tokens: int = 0
    steps: int = 0  # decoder steps run (continuous mode)
    rejected: int = 0
    expired: int = 0
    cancelled: int = 0  # withdrawn by their client, queued or mid-decode
    cpu_s: float = 0.0  # CPU seconds of the engine's thread (its torch worker threads not counted)


def mark_encoded(items: list[WorkItem]) -> None:
    """Joiners' encoder pass is done (its time in their trace; on a GPU, launched)."""
    if items:
        now = time.monotonic()
        for it in items:
            it.encoded = now


def batch_tokens(batch: list[WorkItem]) -> tuple[int, int]:
    """(padded, real) source tokens of a batch: longest x sentences, and the sum."""
    lengths = [len(it.ids) for it in batch]
    return max(lengths) * len(lengths), sum(lengths)


def closest_first(oldest: WorkItem, others: list[WorkItem]) -> list[WorkItem]:
    """`oldest`, then `others` by how far their source length is from its, ties in arrival order.

    Sentences of similar lengths batch with little padding and finish at about the same step; the
    oldest never waits for a better fit.
    """
    return [oldest, *sorted(others, key=lambda it: (abs(len(it.ids) - len(oldest.ids)), it.seq))]


class Throughput:
    """Work (source tokens x beams) finished per second of decoding, over the turns of the last
    WINDOW_S seconds; idle time does not count, so a quiet spell does not make the engine look slow.
    After a quiet spell the last trusted rate holds until there is recent decoding enough: a burst
    that follows one is measured against what the engine last did, not let in unbounded."""

    WINDOW_S = 10.0
    MIN_BUSY_S = 0.5  # decoding time needed before the rate is trusted

    def __init__(self) -> None:
        self.turns: deque[tuple[float, int, float]] = deque()  # (when, work finished, seconds busy)
        self.work, self.busy = 0, 0.0  # the turns' sums, kept as they come and go (asked on every admission)
        self.trusted: float | None = None  # the last rate measured over MIN_BUSY_S of decoding

    def record(self, work: int, busy_s: float, now: float) -> None:
        self.turns.append((now, work, busy_s))
        self.work += work
        self.busy += busy_s
        self._forget(now)

    def rate(self, now: float) -> float | None:
        """Work a second of decoding: over the recent turns, else the last trusted rate, else None
        (an engine that has not yet decoded for MIN_BUSY_S)."""
        self._forget(now)
        if self.busy >= self.MIN_BUSY_S and self.work:
            self.trusted = self.work / self.busy
        return self.trusted

    def _forget(self, now: float) -> None:
        while self.turns and self.turns[0][0] < now - self.WINDOW_S:
            _, work, busy = self.turns.popleft()
            self.work -= work
            self.busy -= busy
        if not self.turns:  # no float drift carried past an empty window
            self.work, self.busy = 0, 0.0


class Queue:
    """The bounded wait queue and the counts both schedulers keep."""

    def __init__(self, config: BatchingConfig) -> None:
        self.config = config
        self.queue: deque[WorkItem] = deque()
        self.stats = BatchStats()
        self.throughput = Throughput()

    def ahead(self) -> int:
        """Work a newcomer waits behind: the queue's (running sentences make room as they go)."""
        return sum(it.cost for it in self.queue)

    def admit(self, items: list[WorkItem], now: float | None = None) -> None:
        """Queue a request's sentences whole, or raise QueueFullError for all of them: when the queue
        would hold more than max_queue sentences, or when they would wait past max_queue_wait_s at the
        rate the engine has been finishing work (answered at once, not after the wait)."""
        if len(self.queue) + len(items) > self.config.max_queue:
            self.stats.rejected += 1
            raise QueueFullError(len(self.queue), self.config.max_queue, retry_after_s=1.0)
        now = time.monotonic() if now is None else now
        rate = self.throughput.rate(now)
        if rate:
            wait = self.ahead() / rate  # until the newcomers start (however large, an idle engine takes them)
            if wait > self.config.max_queue_wait_s:
                self.stats.rejected += 1
                raise QueueFullError(
                    len(self.queue), self.config.max_queue, retry_after_s=max(1.0, wait - 1.0), wait_s=wait
                )
        self.queue.extend(items)

    def expired(self, item: WorkItem, now: float) -> bool:
        """Whether the item is dead (withdrawn, or failed here with DeadlineExceededError)."""
        if item.future.cancelled():
            self.stats.cancelled += 1
            return True
        if now > item.deadline:
            self.stats.expired += 1
            item.future.set_exception(DeadlineExceededError("deadline passed before the translation finished"))
            return True
        return False

    def drop_dead(self, now: float) -> None:
        self.queue = deque(it for it in self.queue if not self.expired(it, now))

    def _take(self, chosen: list[WorkItem], within: int) -> None:
        """Remove the chosen sentences, all among the first `within` queued, from the queue."""
        seqs = {it.seq for it in chosen}
        head = [self.queue.popleft() for _ in range(min(within, len(self.queue)))]
        self.queue.extendleft(reversed([it for it in head if it.seq not in seqs]))

    def record(self, batch: list[WorkItem], in_flight: int) -> None:
        s = self.stats
        s.batches += 1
        s.sentences += len(batch)
        s.max_sentences = max(s.max_sentences, in_flight)
        padded, real = batch_tokens(batch)
        s.padded_tokens += padded
        s.real_tokens += real


class RequestScheduler(Queue):
    """Request-level dynamic batching: whole batches, each decoded to its end."""

    def next_batch(self, now: float) -> tuple[list[WorkItem] | None, float]:
        """The batch to run now, or None and how long to wait before asking again."""
        self.drop_dead(now)
        if not self.queue:
            return None, 1.0
        oldest = self.queue[0]
        same = [it for it in self.queue if it.opts == oldest.opts]
        cfg = self.config
        size = 1 if cfg.mode == "none" else cfg.max_batch_size
        if sum(it.cost for it in same) < cfg.max_batch_tokens and len(same) < size and cfg.mode != "none":
            remaining = cfg.batch_wait_ms / 1000 - (now - oldest.enqueued)
            if remaining > 0:
                return None, remaining
        batch = self._fill(same, size)
        self._take(batch, len(self.queue))
        self.record(batch, len(batch))
        return batch, 0.0

    def _fill(self, same: list[WorkItem], size: int) -> list[WorkItem]:
        """The oldest sentence plus those of closest length while the padded cost fits the budget."""
        oldest, *others = closest_first(same[0], same[1:])
        batch = [oldest]
        longest = len(oldest.ids)
        for it in others:
            width = max(longest, len(it.ids))
            if len(batch) >= size or width * (len(batch) + 1) * it.opts.beam_size > self.config.max_batch_tokens:
                break
            batch.append(it)
            longest = width
        return batch


@dataclass
class Plan:
    """What the next decoder step changes: sentences that join (encoded first) and that leave."""

    join: list[WorkItem]
    leave: list[WorkItem]


class ContinuousScheduler(Queue):
    """Iteration-level scheduling: sentences join and leave the running batch between decoder steps."""

    def __init__(self, config: BatchingConfig) -> None:
        super().__init__(config)
        self.running: dict[int, WorkItem] = {}  # by seq
        self.rows = 0  # hypothesis rows the running sentences hold
        self.cost = 0  # their source tokens x beams
        self.admitted_step = 0  # stats.steps at the last admission

    def ahead(self) -> int:
        """Work a newcomer waits behind: the queue's, less the sentences the running batch has room for now
        (decode_slots, max_batch_size, max_batch_tokens), which the next admission takes however long they then
        decode; so a burst an idle or half-full engine can take at once is not refused for its own size."""
        room = self._room(self.config.decode_slots)
        return sum(it.cost for it in itertools.islice(self.queue, room, None))

    def _room(self, capacity: int, most: float = float("inf")) -> int:
        """How many queued sentences from the head the running batch has room for (_fits), counting to `most`."""
        rows, joining, cost = self.rows, 0, self.cost
        for it in self.queue:  # stops at `most`, or at the first that does not fit
            if joining >= most or not self._fits(it, rows, len(self.running) + joining, cost, capacity):
                break
            rows, joining, cost = rows + it.opts.beam_size, joining + 1, cost + it.cost
        return joining

    def schedule(self, now: float, capacity: int) -> Plan:
        """Admit queued sentences while `capacity` rows, max_batch_size and max_batch_tokens allow (a
        sentence's beams join whole): the oldest first, then those among the ADMISSION_WINDOW oldest
        closest to it in length, up to the first that does not fit. Drop dead running ones."""
        leave = [it for it in self.running.values() if self.expired(it, now)]
        for it in leave:
            self._release(it)
        self.drop_dead(now)
        join: list[WorkItem] = []
        if not self.queue or (self.running and not self._time_to_admit(capacity)):
            return Plan(join, leave)
        head = list(itertools.islice(self.queue, ADMISSION_WINDOW))
        for it in closest_first(head[0], head[1:]):
            idle = not self.running
            if not self._fits(it, self.rows, len(self.running), self.cost, capacity) and not (
                idle and it.opts.beam_size <= capacity
            ):  # one sentence always runs alone, whatever its cost
                break
            join.append(it)
            self.running[it.seq] = it
            self.rows += it.opts.beam_size
            self.cost += it.cost
        if join:
            self._take(join, len(head))
            self.record(join, len(self.running))
            self.admitted_step = self.stats.steps
        return Plan(join, leave)

    def alone(self, now: float) -> list[WorkItem]:
        """The whole queue, to decode as one batch, when nothing runs and it holds at most alone_max_sentences
        sentences of one set of options, each capped at ALONE_MAX_STEPS tokens, within max_batch_tokens; []
        otherwise (they join the running batch)."""
        if self.running:
            return []
        self.drop_dead(now)
        batch = list(self.queue)
        if not batch or len(batch) > self.config.alone_max_sentences or any(it.opts != batch[0].opts for it in batch):
            return []
        if any(max_length(it.opts, len(it.ids), ALONE_MAX_STEPS + 1) > ALONE_MAX_STEPS for it in batch):
            return []
        if len(batch) > 1 and batch_tokens(batch)[0] * batch[0].opts.beam_size > self.config.max_batch_tokens:
            return []
        self.queue.clear()
        self.record(batch, len(batch))
        return batch

    def _fits(self, it: WorkItem, rows: int, sentences: int, cost: int, capacity: int) -> bool:
        """Whether `it` may join a batch holding rows, sentences and cost (source tokens x beams)."""
        cfg = self.config
        return (
            rows + it.opts.beam_size <= capacity
            and sentences < cfg.max_batch_size
            and cost + it.cost <= cfg.max_batch_tokens
        )

    def _time_to_admit(self, capacity: int) -> bool:
        """Newcomers join together: max_waiting_steps steps after the last admission, or at once when
        those that fit are at least waiting_served_ratio of the running sentences. A few sentences
        joining a big batch wait for company: each admission runs the encoder, which costs about a
        decoder step where per-call overhead dominates (small models, GPUs), and (off the C attention)
        copies the batch's cross-attention keys. The steps count from the last admission (as TGI's max_waiting_tokens
        does), not from a sentence's arrival: with a backlog the head has waited long already, and
        counting from arrival let one or two sentences join at nearly every step as rows freed up."""
        cfg = self.config
        if self.stats.steps - self.admitted_step >= cfg.max_waiting_steps:
            return True
        wanted = cfg.waiting_served_ratio * len(self.running)
        return self._room(capacity, wanted) >= wanted

    def finish(self, seq: int) -> WorkItem:
        item = self.running[seq]
        self._release(item)
        return item

    def _release(self, item: WorkItem) -> None:
        del self.running[item.seq]
        self.rows -= item.opts.beam_size
        self.cost -= item.cost
