"""inter_threads: batches decoded in worker processes give what decoding them in this process gives."""

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from model import DecodeOptions, Translator
from model.workers import WorkerError

pytestmark = pytest.mark.slow  # starts Ray, a server, worker processes or training


def test_worker_processes_give_the_same_results_as_this_process(tiny_dir: Path, sources: list[str]) -> None:
    texts = [*sources, ""]  # an empty source stays out of the batches
    here = Translator.load(tiny_dir, "cpu", num_threads=1)
    pooled = Translator.load(tiny_dir, "cpu", num_threads=1, inter_threads=2)
    try:
        assert pooled.pool is not None and pooled.pool.workers == 2
        done: list[int] = []
        # max_batch_size 2: several batches, so both workers decode some of them
        got = pooled.translate(texts, beam_size=3, num_hypotheses=2, max_batch_size=2, progress=done.append)
        want = here.translate(texts, beam_size=3, num_hypotheses=2, max_batch_size=2)
        # Same thread count as here: the same float operations, so the same scores to the last bit.
        assert [(r.token_ids, r.scores) for r in got] == [(r.token_ids, r.scores) for r in want]
        assert sum(done) == len(sources) and len(done) == (len(sources) + 1) // 2  # batches of max_batch_size
        assert got[-1].hypotheses == [""]
        # Few sources for the workers: batches cut smaller than max_batch_size, two per worker.
        sizes: list[int] = []
        got = pooled.translate(sources, beam_size=2, max_batch_size=64, progress=sizes.append)
        assert sizes == [3, 3, 3, 3]
        want = here.translate(sources, beam_size=2, max_batch_size=3)
        assert [(r.token_ids, r.scores) for r in got] == [(r.token_ids, r.scores) for r in want]
        # Two threads sharing the pool: calls take turns, each gets its own results.
        halves = [sources[::2], sources[1::2]]
        answers: dict[int, list[list[list[int]]]] = {}
        threads = [
            threading.Thread(
                target=lambda i=i: answers.__setitem__(
                    i, [r.token_ids for r in pooled.translate(halves[i], beam_size=2, max_batch_size=1)]
                )
            )
            for i in (0, 1)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert answers == {i: [r.token_ids for r in here.translate(halves[i], beam_size=2)] for i in (0, 1)}
    finally:
        pooled.close()
    assert pooled.pool is None
    assert pooled.translate(["A dog."])[0].hypotheses == here.translate(["A dog."])[0].hypotheses  # in this process


def test_a_dead_worker_fails_the_call_instead_of_hanging(tiny_dir: Path, sources: list[str]) -> None:
    tr = Translator.load(tiny_dir, "cpu", num_threads=1, inter_threads=2)
    try:
        assert tr.pool is not None
        tr.translate(sources[:2], max_batch_size=1)  # both workers up
        for pid in tr.pool.pids():
            os.kill(pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(WorkerError, match="died"):
            tr.translate(sources, max_batch_size=1)
        assert time.monotonic() - start < 30
        with pytest.raises(WorkerError, match="closed"):  # its queues may hold stale work: not reused
            tr.translate(sources)
    finally:
        tr.close()


def test_workers_that_cannot_load_the_model_report_why(tmp_path: Path, tiny_dir: Path) -> None:
    from functools import partial

    from model.workers import WorkerPool

    pool = WorkerPool(partial(Translator.load, tmp_path / "missing", "cpu"), workers=1)
    try:
        with pytest.raises(WorkerError, match=r"failed[\s\S]*no model directory"):
            pool.run([[[5, 6, 2]]], DecodeOptions(), lambda i, h: None)
    finally:
        pool.close()


@pytest.mark.parametrize(
    ("device", "inter", "message"), [("cpu", 0, "inter_threads must be >= 1"), ("cuda", 2, "CPU only")]
)
def test_bad_inter_threads_are_refused(tiny_dir: Path, device: str, inter: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Translator.load(tiny_dir, device, inter_threads=inter)
