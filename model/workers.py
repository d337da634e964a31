"""Batches decoded in parallel by worker processes: CTranslate2's `inter_threads`, on CPU.

One process decoding a batch with N intra-op threads leaves cores idle whenever it runs Python or
an operator too small to split (a decoder step of the shipped model is ~400 ATen calls; the beam
search's bookkeeping runs on one thread). Whole batches decoded side by side do not share that
serial part. Threads of one process would: they take turns holding the GIL (two threads of one
intra-op thread each do 1.03x one thread of two on 2 cores, docs/benchmarks.md), so each worker is a
process with its own copy of the model.

Workers are spawned, not forked: a forked child inherits the parent's OpenMP state, and GNU libgomp
is not fork-safe (a child whose parent has run a parallel region can hang in its first one). As
with any spawned process, a script that creates a pool must guard its top level with
`if __name__ == "__main__":`.
"""

from __future__ import annotations

import multiprocessing
import queue
import signal
import threading
import traceback
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

from model.decode.search import Hypothesis
from model.options import DecodeOptions

POLL_SECONDS = 1.0  # how often a waiting parent checks that its workers are alive


class WorkerError(RuntimeError):
    """A worker could not load the model, failed on a batch, or died."""


class BatchDecoder(Protocol):
    def decode_batch(self, batch: list[list[int]], opts: DecodeOptions) -> list[list[Hypothesis]]: ...


class WorkerPool:
    """`workers` processes, each holding what `load()` returns (a Translator on CPU, see Translator.load);
    `load` is pickled into each process, so it must be a module-level callable or a partial of one."""

    def __init__(self, load: Callable[[], BatchDecoder], *, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        ctx = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()  # one call at a time: calls share the result queue
        self._tasks: multiprocessing.Queue[Any] = ctx.Queue()
        self._results: multiprocessing.Queue[Any] = ctx.Queue()
        self._processes: list[BaseProcess] = [
            ctx.Process(
                target=_work, args=(load, self._tasks, self._results), name=f"beamserve-worker-{i}", daemon=True
            )
            for i in range(workers)
        ]
        for p in self._processes:
            p.start()  # each loads its model while the caller goes on

    @property
    def workers(self) -> int:
        return len(self._processes)

    def pids(self) -> list[int]:
        return [p.pid for p in self._processes if p.pid is not None]

    def run(
        self, batches: list[list[list[int]]], opts: DecodeOptions, done: Callable[[int, list[list[Hypothesis]]], None]
    ) -> None:
        """Decode batches (each at most opts.max_batch_size sources); done(batch index, its n-best lists)
        is called as each finishes. Longest batches go first, so that the last to start is a short one.

        Raises WorkerError, and closes the pool, when a worker fails: batches still queued or running
        would otherwise answer a later call.
        """
        with self._lock:
            if not self._processes:
                raise WorkerError("the worker pool is closed")
            for i in sorted(range(len(batches)), key=lambda i: -max(map(len, batches[i]), default=0)):
                self._tasks.put((i, batches[i], opts))
            try:
                for _ in batches:
                    i, result = self._next_result()
                    if isinstance(result, str):  # the worker's traceback
                        raise WorkerError(f"a translation worker failed:\n{result}")
                    done(i, result)
            except BaseException:  # a failure, or Ctrl-C in the caller: the queued and running batches are dropped
                self.close(wait_s=0.0)
                raise

    def _next_result(self) -> tuple[int, Any]:
        while True:
            try:
                return self._results.get(timeout=POLL_SECONDS)
            except queue.Empty:
                dead = [p for p in self._processes if not p.is_alive()]
                if dead:  # the batches it held are lost: fail the call rather than wait forever
                    codes = ", ".join(f"{p.name}: exit code {p.exitcode}" for p in dead)
                    raise WorkerError(f"a translation worker died ({codes})") from None

    def close(self, wait_s: float = 5.0) -> None:
        """Stop the workers: idle ones exit at once, ones still busy after wait_s are terminated."""
        processes, self._processes = self._processes, []
        for _ in processes:
            self._tasks.put(None)
        for p in processes:
            p.join(timeout=wait_s)
            if p.is_alive():
                p.terminate()
                p.join()


def _work(
    load: Callable[[], BatchDecoder], tasks: multiprocessing.Queue[Any], results: multiprocessing.Queue[Any]
) -> None:
    """A worker process: load the model once, then decode batches until told to stop (None)."""
    # Ctrl-C reaches the whole process group: the parent handles it and stops the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    try:
        tr = load()
    except Exception:
        # Every task fails with the reason, rather than the parent waiting for a worker that never comes.
        reason = traceback.format_exc()
        while (task := tasks.get()) is not None:
            results.put((task[0], reason))
        return
    while (task := tasks.get()) is not None:
        i, batch, opts = task
        try:
            results.put((i, tr.decode_batch(batch, opts)))  # cut, sorted and non-empty by the caller
        except Exception:
            results.put((i, traceback.format_exc()))
