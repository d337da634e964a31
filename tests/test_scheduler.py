"""The continuous scheduler's decisions (no model: admission is bookkeeping over rows, tokens and time)."""

from __future__ import annotations

import pytest

from model import DecodeOptions
from service.batching import GPU_SIZES, BatchingConfig, sized_for
from service.engine import scheduler as scheduler_module
from service.engine.scheduler import (
    ContinuousScheduler,
    DeadlineExceededError,
    QueueFullError,
    RequestScheduler,
    WorkItem,
)

FAR = 1e12  # a deadline that never passes


def item(tokens: int = 10, beam: int = 4, deadline: float = FAR) -> WorkItem:
    return WorkItem(list(range(tokens)), DecodeOptions(beam_size=beam), deadline)


def scheduler(**config: object) -> ContinuousScheduler:
    return ContinuousScheduler(BatchingConfig(**{"max_waiting_steps": 0, **config}))  # type: ignore[arg-type]


def test_admits_in_arrival_order_among_equal_lengths_while_rows_fit() -> None:
    s = scheduler()
    items = [item(beam=4), item(beam=4), item(beam=8), item(beam=1)]
    s.admit(items)
    plan = s.schedule(0.0, capacity=10)
    assert plan.join == items[:2] and s.rows == 8
    assert list(s.queue) == items[2:]  # the beam-8 head waits; the beam-1 behind it does not overtake


def test_a_backlog_admits_the_oldest_then_the_closest_lengths(monkeypatch: pytest.MonkeyPatch) -> None:
    items = [item(tokens=n) for n in (10, 30, 12, 29, 9, 11)]
    s = scheduler(max_batch_size=4)
    s.admit(items)
    assert s.schedule(0.0, capacity=256).join == [items[0], items[4], items[5], items[2]]  # 10, then 9, 11, 12
    assert list(s.queue) == [items[1], items[3]]  # in arrival order, for the next admission
    s.finish(items[0].seq)
    s.finish(items[4].seq)
    assert s.schedule(0.0, capacity=256).join == [items[1], items[3]]  # 30 is now the oldest: it goes first
    monkeypatch.setattr(scheduler_module, "ADMISSION_WINDOW", 3)  # only the 3 oldest are looked at
    s = scheduler(max_batch_size=2)
    s.admit(items)
    assert s.schedule(0.0, capacity=256).join == [items[0], items[2]]  # 10, 12; not 9 or 11, further back
    assert list(s.queue) == [items[1], *items[3:]]


def test_an_idle_engine_takes_a_few_short_sentences_of_one_kind_as_one_whole_batch() -> None:
    from service.engine.scheduler import ALONE_MAX_STEPS

    s = scheduler()
    few = [item(tokens=12), item(tokens=20)]
    s.admit(few)
    assert s.alone(0.0) == few and not s.queue and not s.running
    s.admit([item(tokens=12, beam=4), item(tokens=12, beam=1)])  # two sets of options: the running batch
    assert s.alone(0.0) == [] and len(s.queue) == 2
    s.queue.clear()
    s.admit([item() for _ in range(BatchingConfig.alone_max_sentences + 1)])  # more than a few
    assert s.alone(0.0) == []
    s.queue.clear()
    off = scheduler(alone_max_sentences=0)
    off.admit([item()])
    assert off.alone(0.0) == []
    s.queue.clear()
    capped = (ALONE_MAX_STEPS - 10) // 2  # max_length_ratio 2 and offset 10: the longest source taken whole
    s.admit([item(tokens=capped + 1)])
    assert s.alone(0.0) == []
    s.queue.clear()
    s.admit([item(tokens=capped)])
    assert len(s.alone(0.0)) == 1
    s.admit([item(), item()])
    s.schedule(0.0, capacity=256)  # one running: newcomers join it
    s.admit([item()])
    assert s.alone(0.0) == [] and len(s.queue) == 1


def test_request_batches_take_the_oldest_then_the_closest_lengths() -> None:
    items = [item(tokens=n) for n in (10, 30, 12, 29, 9, 11)]
    s = RequestScheduler(BatchingConfig(mode="request", max_batch_size=3))
    s.admit(items)
    batch, _ = s.next_batch(0.0)
    assert batch == [items[0], items[4], items[5]]  # 10, then 9 and 11
    batch, _ = s.next_batch(0.0)
    assert batch == [items[1], items[3], items[2]]  # 30, then 29 and 12


def test_sentence_cap_and_token_budget_bound_admission() -> None:
    s = scheduler(max_batch_size=2)
    s.admit([item(), item(), item()])
    assert len(s.schedule(0.0, 256).join) == 2
    s = scheduler(max_batch_tokens=100)
    s.admit([item(tokens=10), item(tokens=10), item(tokens=10)])  # cost 40 each
    assert len(s.schedule(0.0, 256).join) == 2


def test_an_idle_engine_runs_one_sentence_whatever_its_cost() -> None:
    s = scheduler(max_batch_tokens=10)
    big = item(tokens=100)
    s.admit([big, item()])
    assert s.schedule(0.0, 256).join == [big]


def test_newcomers_wait_a_few_steps_to_be_encoded_together() -> None:
    s = scheduler(max_waiting_steps=3)
    s.admit([item() for _ in range(8)])
    s.schedule(0.0, 256)  # idle: joins at once
    s.admit([item()])
    for _ in range(2):
        s.stats.steps += 1
        assert s.schedule(0.0, 256).join == []  # one newcomer to 8 running: waits for company
    s.stats.steps += 1
    assert len(s.schedule(0.0, 256).join) == 1  # waited max_waiting_steps


def test_newcomers_a_quarter_of_the_running_sentences_join_at_once() -> None:
    s = scheduler(max_waiting_steps=5)  # waiting_served_ratio 0.25
    s.admit([item() for _ in range(8)])
    s.schedule(0.0, 1024)
    s.admit([item()])
    assert s.schedule(0.0, 1024).join == []
    s.admit([item()])
    assert len(s.schedule(0.0, 1024).join) == 2  # 2 >= 0.25 x 8


def test_newcomers_count_only_if_they_fit() -> None:
    # However long the queue, only the sentences that fit (rows, sentence cap, token budget) would join:
    # with one place left, a newcomer waits for more to free up (one encoder call for several).
    for config, capacity in (({}, 36), ({"max_batch_size": 9}, 1024), ({"max_batch_tokens": 360}, 1024)):
        s = scheduler(max_waiting_steps=5, **config)
        s.admit([item() for _ in range(8)])  # 32 rows, 8 sentences, cost 320
        s.schedule(0.0, capacity)
        s.admit([item() for _ in range(10)])
        assert s.schedule(0.0, capacity).join == [], config
        s.stats.steps += 5
        assert len(s.schedule(0.0, capacity).join) == 1, config


def test_a_backlog_joins_in_groups_not_one_by_one_as_rows_free() -> None:
    # The head of a backlog has waited long for rows; it still waits for company once rows free up.
    s = scheduler(max_waiting_steps=4)
    running = [item() for _ in range(8)]
    s.admit(running + [item() for _ in range(10)])
    assert len(s.schedule(0.0, 32).join) == 8  # full: 32 rows
    s.stats.steps += 10
    running[0].future.cancel()  # one sentence leaves: one place, and no admission for 10 steps
    assert len(s.schedule(0.0, 32).join) == 1
    s.stats.steps += 1
    running[1].future.cancel()  # the next place frees a step later: the backlog waits for company
    assert s.schedule(0.0, 32).join == []
    s.stats.steps += 2
    assert s.schedule(0.0, 32).join == []
    s.stats.steps += 1  # max_waiting_steps after the last admission
    assert len(s.schedule(0.0, 32).join) == 1


def test_running_sentences_leave_when_withdrawn_or_past_their_deadline() -> None:
    s = scheduler()
    gone, late, fine = item(), item(deadline=5.0), item()
    s.admit([gone, late, fine])
    s.schedule(0.0, 256)
    gone.future.cancel()
    plan = s.schedule(6.0, 256)
    assert set(map(id, plan.leave)) == {id(gone), id(late)} and list(s.running.values()) == [fine]
    assert s.rows == 4 and s.stats.cancelled == 1 and s.stats.expired == 1
    with pytest.raises(DeadlineExceededError):
        late.future.result()


def test_full_queue_refuses_the_whole_request() -> None:
    s = scheduler(max_queue=3)
    s.admit([item(), item()])
    with pytest.raises(QueueFullError):
        s.admit([item(), item()])
    assert len(s.queue) == 2 and s.stats.rejected == 1


def test_unset_sizes_follow_the_device_and_set_ones_win() -> None:
    settings = {
        "mode": "continuous",
        "decode_slots": None,
        "max_batch_size": 32,
        "max_queue": None,
        "max_batch_tokens": None,
        "port": 8000,
    }  # a settings dict: other keys are ignored
    cpu, gpu = sized_for("cpu", settings), sized_for("cuda", settings)
    assert (cpu.decode_slots, cpu.max_queue, cpu.max_batch_tokens) == (256, 512, 6144)  # BatchingConfig's
    assert (gpu.decode_slots, gpu.max_queue, gpu.max_batch_tokens) == (
        GPU_SIZES["decode_slots"],
        GPU_SIZES["max_queue"],
        GPU_SIZES["max_batch_tokens"],
    )
    assert cpu.max_batch_size == gpu.max_batch_size == 32


def test_a_request_that_would_wait_past_max_queue_wait_is_refused_at_once() -> None:
    s = scheduler(max_queue_wait_s=1.0, decode_slots=4)
    s.admit([item(tokens=10)], now=0.0)
    assert len(s.schedule(0.0, capacity=4).join) == 1  # its rows fill the batch: every newcomer waits
    s.admit([item(tokens=10) for _ in range(5)], now=0.0)  # no decoding rate known yet: only max_queue applies
    for t in range(10):  # 440 work units (tokens x beams) a second of decoding, busy half of each second
        s.throughput.record(220, busy_s=0.5, now=100.5 + t)
    assert s.throughput.rate(110.0) == pytest.approx(440.0)  # the idle halves do not count
    # 5 x 40 = 200 units queued: 0.45 s ahead; then 10 x 40 = 400: 0.91 s; then 480: 1.09 s.
    s.admit([item(tokens=10) for _ in range(5)], now=110.0)
    s.admit([item(tokens=10) for _ in range(2)], now=110.0)
    with pytest.raises(QueueFullError, match=r"about 1\.1s of work queued ahead") as refused:
        s.admit([item(tokens=10)], now=110.0)
    assert refused.value.retry_after_s == 1.0 and len(s.queue) == 12 and s.stats.rejected == 1
    # After a quiet spell the last trusted rate holds: a burst is refused as it was before the spell.
    assert s.throughput.rate(200.0) == pytest.approx(440.0)
    with pytest.raises(QueueFullError):
        s.admit([item(tokens=10)], now=200.0)
    fresh = scheduler(max_queue_wait_s=1.0, decode_slots=4)
    fresh.throughput.record(0, busy_s=5.0, now=200.0)
    assert fresh.throughput.rate(200.0) is None  # decoding that finished nothing says nothing
    fresh.admit([item(tokens=10) for _ in range(20)], now=200.0)  # no rate: only max_queue applies


def test_a_burst_the_running_batch_has_room_for_waits_for_nothing() -> None:
    s = scheduler(max_queue_wait_s=1.0, decode_slots=40, max_batch_size=10)
    s.admit([item(tokens=10) for _ in range(4)], now=0.0)
    assert len(s.schedule(0.0, capacity=40).join) == 4  # 16 of 40 rows, 4 of 10 sentences run
    s.throughput.record(100, busy_s=1.0, now=10.0)  # 100 units a second, as lone sentences decoded
    s.admit([item(tokens=10) for _ in range(6)], now=10.0)  # 240 units the batch has room for: not ahead
    assert s.ahead() == 0
    s.admit([item(tokens=10) for _ in range(3)], now=10.0)  # 3 past the room (max_batch_size): 120 units, 1.2 s
    assert s.ahead() == 120
    with pytest.raises(QueueFullError, match=r"about 1\.2s of work queued ahead"):
        s.admit([item(tokens=10)], now=10.0)
    plan = s.schedule(10.0, capacity=40)
    assert len(plan.join) == 6 and s.ahead() == 120  # the next admission took the room's six; the rest wait on


def test_an_idle_engine_takes_a_request_however_large() -> None:
    s = scheduler(max_queue_wait_s=0.1)
    s.throughput.record(100, busy_s=1.0, now=10.0)
    s.admit([item(tokens=50) for _ in range(64)], now=10.0)  # 12,800 units: 128 s of work, nothing ahead
    with pytest.raises(QueueFullError):
        s.admit([item()], now=10.0)
