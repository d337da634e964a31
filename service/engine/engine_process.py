"""EngineProcess: a replica's batching engine in a process of its own (service/engine/engine_host.py), with the
Engine's interface as a replica uses it (translate, align, health, reconfigure, close, its counts).

The replica keeps the text side (tokenizing, splitting, answering) and sends ids; the host decodes and sends
hypotheses back. One socket carries both ways; the event loop the calls come from reads the answers. Beside the
replica's event loop, an engine in the same process waits for the GIL whenever the loop runs Python; in its
own process it does not (docs/benchmarks.md, "Served one at a time, and at saturation").

A host that exits (killed, out of memory) fails the calls it held with `replica_unavailable`, which the gateway
asks again once; the next call starts a fresh host, and waits for it. Past RESTARTS restarts in RESTART_WINDOW_S
(a host that crashes as it loads or as it decodes, again and again) none is started: the replica's health
check then fails, and Serve replaces the replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import fields, replace
from multiprocessing.connection import Connection
from typing import Any

from model.decode.align import Link
from model.decode.confidence import ScoringResult
from model.decode.search import Hypothesis
from model.options import DecodeOptions
from service.batching import BatchingConfig
from service.engine.engine import BatchTiming, EngineObserver, RequestTiming
from service.engine.engine_host import EngineState, HostSpec, ModelFacts, Report
from service.engine.scheduler import BatchStats
from service.errors import CodedError

logger = logging.getLogger(__name__)
CLOSE_S = 10.0  # how long a closing host may take to stop its engine before it is killed
RESTARTS, RESTART_WINDOW_S = 3, 300.0
STATE_S = 1.0
START_S = 900.0  # a host's load and warm-up (an NLLB model from a slow disk included)
_STARTED: weakref.WeakSet[EngineProcess] = weakref.WeakSet()


def running() -> int:
    """Engine processes this process started that have not exited."""
    return sum(e.process.poll() is None for e in list(_STARTED))


class EngineProcessError(CodedError):
    """The engine's process could not load its model, or has exited (503: the gateway asks once more)."""

    code = "replica_unavailable"


class EngineProcess:
    """The engine in a host process; called from one event loop, which reads the answers."""

    def __init__(self, spec: HostSpec) -> None:
        """Start the host and wait until its model is loaded and warm; EngineProcessError if it fails."""
        self.spec = spec
        self.config = spec.config
        self.observer: EngineObserver | None = None
        self.restarts: list[float] = []  # when each host after the first was started
        self.closed = False
        self._send_lock = threading.Lock()  # the event loop and Serve's threads send
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop calls come from: it reads the answers
        self._restarting: asyncio.Lock | None = None
        self._earlier = BatchStats()  # the counts of hosts that have exited
        self._start()
        _STARTED.add(self)

    def _start(self) -> None:
        """Start a host and wait for it; it replaces the last one only once ready, so that a call arriving
        meanwhile finds the last one gone and waits for this start (`_restart`'s lock)."""
        ours, theirs = socket.socketpair()
        # The host imports what this process imports, from where this process found it (a Ray worker's
        # working directory included).
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        process = subprocess.Popen(
            [sys.executable, "-m", "service.engine.engine_host", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            env=env,
        )
        theirs.close()
        conn = Connection(ours.detach())
        try:
            conn.send(replace(self.spec, config=self.config))  # the knobs as reconfigured since
            facts, state = _ready(process, conn)
        except BaseException:
            if process.poll() is None:
                process.kill()
                process.wait()
            conn.close()
            raise
        self.problem: str | None = None  # the host's last word on its engine's health
        self.process, self.conn, self.facts, self.state = process, conn, facts, state

    @property
    def queued(self) -> int:
        return self.state.queued

    @property
    def active(self) -> int:
        return self.state.active

    @property
    def stats(self) -> BatchStats:
        """The counts of every host this replica has started."""
        now, earlier = self.state.batch_stats(), self._earlier
        summed = {f.name: getattr(now, f.name) + getattr(earlier, f.name) for f in fields(BatchStats)}
        return BatchStats(**{**summed, "max_sentences": max(now.max_sentences, earlier.max_sentences)})

    @property
    def resident_bytes(self) -> int:
        """The host's resident memory, as of its last answer or report."""
        return self.state.resident_bytes

    async def translate(
        self,
        sources: list[list[int]],
        opts: DecodeOptions,
        timeout_s: float,
        timing: RequestTiming | None = None,
    ) -> list[list[Hypothesis]]:
        """Engine.translate, decoded in the host; cancelling the awaiting task withdraws the request there."""
        traced = timing is not None and timing.traced
        nbest, queue_wait_s, decode_s, batches = await self._call("translate", sources, opts, timeout_s, traced)
        if timing is not None:
            timing.queue_wait_s, timing.decode_s = queue_wait_s, decode_s
            timing.batches = [BatchTiming(*b) for b in batches]
        return [[Hypothesis(tokens, score) for tokens, score in hs] for hs in nbest]

    async def align(
        self, pairs: list[tuple[str, str]], *, src_lang: str | None, tgt_lang: str | None
    ) -> list[list[Link]]:
        return await self._call("align", pairs, src_lang, tgt_lang)

    async def score(
        self, pairs: list[tuple[str, str]], *, src_lang: str | None, tgt_lang: str | None
    ) -> list[ScoringResult]:
        return await self._call("score", pairs, src_lang, tgt_lang)

    async def refresh(self) -> None:
        """The host's counts as of now, where it answers within STATE_S (its reader thread answers, whatever the
        engine's thread is doing); else they stay as of its last message. Never starts a host."""
        if self.conn.closed or self.process.poll() is not None:
            return
        with contextlib.suppress(EngineProcessError, TimeoutError):
            async with asyncio.timeout(STATE_S):
                await self._call("state")

    async def _call(self, kind: str, *args: Any) -> Any:
        if self.conn.closed or self.process.poll() is not None:  # its socket closes as the host exits
            await self._restart()
        loop = self._attach()
        rid = next(self._ids)
        future = loop.create_future()
        self._calls[rid] = future
        try:
            self._send((kind, rid, *args))
            return await future
        except asyncio.CancelledError:
            if self._calls.pop(rid, None) is not None:
                self._send(("cancel", rid), quiet=True)
            raise
        finally:
            self._calls.pop(rid, None)

    async def _restart(self) -> None:
        """Start a fresh host in place of one that has exited (one start at a time; the calls wait for it)."""
        if self._restarting is None:
            self._restarting = asyncio.Lock()
        async with self._restarting:
            if not self.conn.closed and self.process.poll() is None:  # another call has started it meanwhile
                return
            self._detach()
            code = await asyncio.to_thread(self._ended)
            if not self._restartable():
                raise EngineProcessError(self.health() or "the engine's process has exited")
            logger.warning("the engine's process exited with code %s; starting another", code)
            self._earlier = self.stats
            self._loop = None
            self.restarts.append(time.monotonic())
            await asyncio.to_thread(self._start)

    def _ended(self) -> int:
        """The host's exit code once it has exited, killed past CLOSE_S (a host told to close, or whose socket has
        closed)."""
        try:
            return self.process.wait(timeout=CLOSE_S)
        except subprocess.TimeoutExpired:
            logger.warning("the engine's process did not stop within %.0fs: killed", CLOSE_S)
            self.process.kill()
            return self.process.wait()

    def _restartable(self) -> bool:
        recent = [t for t in self.restarts if time.monotonic() - t < RESTART_WINDOW_S]
        return not self.closed and len(recent) < RESTARTS

    def _attach(self) -> asyncio.AbstractEventLoop:
        """The calling loop, reading the host's messages from the first call on: an answer wakes the loop that
        awaits it, with no thread between."""
        loop = asyncio.get_running_loop()
        if self._loop is None or (self._loop is not loop and self._loop.is_closed()):  # a closed loop's reader went
            if self.conn.closed:
                raise EngineProcessError(f"the engine's process has exited ({self.health() or 'closed'})")
            self._loop = loop
            loop.add_reader(self.conn.fileno(), self._readable)
        elif loop is not self._loop:
            raise RuntimeError("an EngineProcess is called from one running event loop at a time")
        return loop

    def _send(self, message: tuple[Any, ...], *, quiet: bool = False) -> None:
        try:
            with self._send_lock:
                self.conn.send(message)
        except OSError as exc:
            if not quiet:
                raise EngineProcessError(f"the engine's process has exited ({self.health()})") from exc

    def _readable(self) -> None:
        """On the loop: answers to their calls, reports to the observer, until the socket closes."""
        try:  # one message a call: the loop calls again while the socket has more (a poll costs as much)
            self._handle(self.conn.recv())
        except (EOFError, OSError):
            self._detach()

    def _handle(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind in ("done", "error"):
            _, rid, result, state = message
            self.state = EngineState(*state)
            future = self._calls.pop(rid, None)
            if future is not None and not future.done():
                future.set_result(result) if kind == "done" else future.set_exception(result)
        elif kind == "report":
            self._record(message[1])
        elif kind == "health":
            self.problem = message[1]

    def _detach(self, why: str = "the engine's process has exited") -> None:
        """On the loop (or with none): stop reading, close the socket, fail the calls still waiting."""
        if self.conn.closed:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.conn.fileno())
        self.conn.close()
        gone = EngineProcessError(why)
        for future in self._calls.values():
            if not future.done():
                future.set_exception(gone)

    def _record(self, report: Report) -> None:
        if report.state is not None:
            self.state = EngineState(*report.state)
        if self.observer is None:
            return
        for batch in report.batches:
            self.observer.on_batch(*batch)
        for rows in report.rows:
            self.observer.on_step(rows)
        self.observer.on_generated(report.generated)
        s = self.state
        self.observer.sync(self.stats, s.queued, s.active, report.gpu_bytes, due=True)

    def health(self, stall_s: float | None = None) -> str | None:
        """Why the engine cannot serve, or None: its process exited and is not started again (past RESTARTS; one
        that is is started at the next call), or the host said its engine's thread died or wedged (the host
        checks with the HostSpec's stall_s; `stall_s` is Engine.health's)."""
        code = self.process.poll()
        if code is None:
            return self.problem
        if self._restartable():
            return None
        said = f"the engine's process exited with code {code}"
        return said if self.closed else f"{said}, after {len(self.restarts)} restarts (not started again)"

    def reconfigure(self, config: BatchingConfig) -> None:
        self.config = config
        self._send(("reconfigure", config), quiet=True)  # a host started later takes it from its spec

    def close(self) -> None:
        """Stop the host (it withdraws what it still holds) and wait for it, killing it past CLOSE_S; from any
        thread."""
        self._send(("close",), quiet=True)
        self._ended()
        self.closed = True  # never started again
        loop = self._loop
        if loop is None or loop.is_closed():
            self._detach("the engine is closed")
        else:
            loop.call_soon_threadsafe(self._detach, "the engine is closed")


def _ready(process: subprocess.Popen[bytes], conn: Connection) -> tuple[ModelFacts, EngineState]:
    """What a starting host says once its model is loaded and warm; EngineProcessError if it fails to."""
    deadline = time.monotonic() + START_S
    while not conn.poll(1.0):
        code = process.poll()
        if code is not None:
            raise EngineProcessError(f"the engine's process exited with code {code} while loading its model")
        if time.monotonic() > deadline:
            raise EngineProcessError(f"the engine's process did not load its model within {START_S:.0f}s")
    try:
        kind, payload = conn.recv()
    except (EOFError, OSError):
        raise EngineProcessError("the engine's process exited while loading its model") from None
    if kind == "failed":
        raise EngineProcessError(f"the engine's process could not load its model:\n{payload}")
    facts, state = payload
    return facts, EngineState(*state)
