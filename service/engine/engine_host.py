"""The engine's own process (Settings.engine_process): a replica's model and batching engine, fed over a
socket by the replica's EngineProcess (service/engine/engine_process.py).

A replica's event loop parses, tokenizes and answers requests in Python. In the engine's process that Python
holds the GIL that the engine's thread takes back about 80 times a decoder step (each PyTorch op and C call
releases it), so the two run one after the other. Here the engine shares its GIL only with this process's
loop, which moves ids in and hypotheses out (docs/benchmarks.md, "Served one at a time, and at saturation").

Started as `python -m service.engine.engine_host FD`, FD its end of a socket pair. Messages are pickled tuples:
parent -> host: a HostSpec first, then ("translate", rid, sources, opts, timeout_s, traced), ("align", rid, pairs,
src_lang, tgt_lang), ("score", rid, pairs, src_lang, tgt_lang), ("state", rid), ("cancel", rid), ("reconfigure",
config), ("close",);
host -> parent: ("ready", (ModelFacts, state)) or ("failed", traceback) first, then ("done", rid, result, state),
("error", rid, exception, state), ("report", Report) and ("health", problem or None).
The engine's thread sends each answer as its last sentence finishes, and its metrics' reports: no hop through
another thread on the way out. The host exits when its socket closes: a replica that dies takes its engine with it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from model.translator import Translator
from service.batching import BatchingConfig
from service.engine import allocator
from service.engine.engine import Engine, Request, RequestTiming, warm_up
from service.engine.scheduler import BatchStats

logger = logging.getLogger("beamserve.engine_host")
REPORT_S = 0.5  # the engine's counts reach the replica's metrics within this long (as ModelMetrics' FLUSH_S)
HEALTH_S = 1.0  # how often the host checks its engine's thread


@dataclass(frozen=True)
class HostSpec:
    """What the host loads and how it batches."""

    path: str
    device: str
    dtype: str | None
    compute_type: str | None
    threads: int
    config: BatchingConfig
    max_length: int
    static_slots: bool
    compiled_step: bool
    warm_up: tuple[str, str | None]  # a source text as the model takes it, and its language (NLLB's), or None
    stall_s: float  # a turn this long with work waiting: the engine is wedged


@dataclass(frozen=True)
class ModelFacts:
    """What a replica says of the model it serves (its log, metrics, /v1/models), wherever the model is held."""

    device: str
    dtype: str
    compute_type: str
    digest: str
    max_source_tokens: int
    licence: str | None
    revision: str | None
    load_seconds: float
    kernels: str  # what computes, for a person (model/kernels/execution.py's Plan.kernels)
    kernels_built: bool  # the library's kernels compute this model (Plan.c)
    plan: dict[str, Any]  # the model's execution plan as /v1/models shows it (Plan.describe)
    allocator: str  # the malloc of the process holding the model
    defaults: dict[str, Any]  # the decoding options the model's generation_config.json sets (model/io/generation.py)

    @property
    def device_type(self) -> str:
        return self.device.split(":")[0]

    @classmethod
    def of(cls, tr: Translator) -> ModelFacts:
        return cls(
            device=str(tr.device),
            dtype=str(tr.dtype).removeprefix("torch."),
            compute_type=tr.compute_type,
            digest=tr.digest,
            max_source_tokens=tr.max_source_tokens,
            licence=tr.licence,
            revision=tr.revision,
            load_seconds=tr.load_seconds,
            kernels=tr.plan.kernels,
            kernels_built=tr.plan.c,
            plan=tr.plan.describe(),
            allocator=allocator.in_use(),
            defaults=dict(tr.generation.options),
        )


class EngineState(NamedTuple):
    """The engine's counts and gauges as of a message (what the replica's info says). It crosses the socket
    as a plain tuple, as answers do (their hypotheses as (tokens, score) pairs): an idle replica woken by an
    answer unpickles plain tuples in about a third of the time it takes for dataclasses."""

    queued: int
    active: int
    stats: tuple[float, ...]  # BatchStats's fields, in order
    resident_bytes: int

    def batch_stats(self) -> BatchStats:
        return BatchStats(*self.stats)  # type: ignore[arg-type]


@dataclass
class Report:
    """What the engine told its observer since the last report (service/metrics.py records it), and its gauges."""

    batches: list[tuple[int, int, int, list[float]]] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    generated: int = 0
    gpu_bytes: int = 0
    state: tuple[Any, ...] | None = None  # an EngineState's fields


class Relay:
    """The engine's observer in the host: keeps its reports and sends them at most every REPORT_S (a message a
    decoder step would cost the step more than the metrics are worth)."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.report = Report()
        self.gauges: tuple[int, ...] = ()
        self.unsent = False
        self.sent = 0.0

    def on_batch(self, sentences: int, padded: int, real: int, waits: list[float]) -> None:
        self.report.batches.append((sentences, padded, real, waits))
        self.unsent = True

    def on_step(self, rows: int) -> None:
        self.report.rows.append(rows)
        self.unsent = True

    def on_generated(self, tokens: int) -> None:
        self.report.generated += tokens
        self.unsent = True

    def sync(
        self, stats: BatchStats, queued: int, active: int, gpu_bytes: int, *, idle: bool = False, due: bool = False
    ) -> float | None:
        gauges = (stats.rejected, stats.expired, stats.cancelled, queued, active, gpu_bytes)
        self.unsent |= gauges != self.gauges
        self.gauges = gauges
        now = time.monotonic()
        if self.unsent and now - self.sent >= REPORT_S:
            report, self.report = self.report, Report()
            report.gpu_bytes, report.state = gpu_bytes, self.host.state(stats, queued, active)
            self.unsent, self.sent = False, now
            self.host.send(("report", report))
            return None
        return REPORT_S - (now - self.sent) if idle and self.unsent else None


class Host:
    """Reads the replica's messages on the main thread; the engine's thread sends each answer as it finishes."""

    def __init__(self, conn: Connection, spec: HostSpec) -> None:
        self.conn = conn
        self.spec = spec
        self.requests: dict[int, Request] = {}
        self._send_lock = threading.Lock()  # the reader, the engine's thread and the watcher send
        self.closed = threading.Event()
        self.translator = Translator.load(
            spec.path, spec.device, dtype=spec.dtype, compute_type=spec.compute_type, num_threads=spec.threads
        )
        self.engine = Engine(
            self.translator,
            spec.config,
            max_length=spec.max_length,
            static_slots=spec.static_slots,
            compiled_step=spec.compiled_step,
        )
        text, lang = spec.warm_up
        warm_up(self.engine, [self.translator.encode(text, lang=lang)])
        self.resident_bytes = allocator.resident_bytes()  # kept by watch(): a read of /proc an answer costs more

    def state(
        self, stats: BatchStats | None = None, queued: int | None = None, active: int | None = None
    ) -> tuple[Any, ...]:
        """An EngineState's fields as of now (a copy: the engine goes on counting)."""
        e = self.engine
        return (
            e.queued if queued is None else queued,
            e.active if active is None else active,
            tuple(vars(stats if stats is not None else e.stats).values()),
            self.resident_bytes,
        )

    def send(self, message: tuple[Any, ...]) -> None:
        try:
            with self._send_lock:
                self.conn.send(message)
        except (pickle.PicklingError, TypeError, AttributeError):  # an exception that does not pickle
            self.send(("error", message[1], RuntimeError(repr(message[2])), message[3]))
        except OSError:  # the replica has gone: so does this process
            self.closed.set()

    def serve(self) -> None:
        """Handle the replica's messages until it says close or goes away."""
        while not self.closed.is_set():
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                break
            self.handle(message)
        self.closed.set()
        for request in list(self.requests.values()):
            request.cancel()
        self.engine.close()

    def handle(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "translate":
            _, rid, sources, opts, timeout_s, traced = message
            try:
                request = Request(self.engine, sources, opts, timeout_s)
            except Exception as exc:  # refused at once: too large, queue full
                self.send(("error", rid, exc, self.state()))
                return
            self.requests[rid] = request
            request.future.add_done_callback(partial(self.answer, rid, request, traced=traced))
        elif kind == "align":
            _, rid, pairs, src_lang, tgt_lang = message
            align = partial(self.translator.align, pairs, src_lang=src_lang, tgt_lang=tgt_lang)
            self.engine.call(align).add_done_callback(partial(self.answer, rid, None))
        elif kind == "score":
            _, rid, pairs, src_lang, tgt_lang = message
            sources, targets = [s for s, _ in pairs], [t for _, t in pairs]
            score = partial(self.translator.score, sources, targets, src_lang=src_lang, tgt_lang=tgt_lang)
            self.engine.call(score).add_done_callback(partial(self.answer, rid, None))
        elif kind == "state":
            self.send(("done", message[1], None, self.state()))
        elif kind == "cancel":
            withdrawn = self.requests.pop(message[1], None)
            if withdrawn is not None:
                withdrawn.cancel()
        elif kind == "reconfigure":
            self.engine.reconfigure(message[1])
        elif kind == "close":
            self.closed.set()

    def answer(
        self, rid: int, request: Request | None, future: concurrent.futures.Future[Any], *, traced: bool = False
    ) -> None:
        """Send a finished call's answer (on the thread that finished it: the engine's, most often); a translation
        `traced` carries its batches' timings too."""
        self.requests.pop(rid, None)
        if future.cancelled():
            return  # the replica withdrew it and awaits nothing
        failure = future.exception()
        if failure is not None:
            self.send(("error", rid, failure, self.state()))
            return
        result = future.result()
        if request is not None:  # a translation: plain (tokens, score) pairs, and the request's timing
            timing = RequestTiming(traced=traced)
            timing.measure(request.items)
            nbest = [[(h.tokens, h.score) for h in hs] for hs in result]
            result = (nbest, timing.queue_wait_s, timing.decode_s, [tuple(b) for b in timing.batches])
        self.send(("done", rid, result, self.state()))

    def watch(self) -> None:
        """Tell the replica when the engine's health changes (its thread died, a turn wedged)."""
        said: str | None = None
        while not self.closed.wait(HEALTH_S):
            self.resident_bytes = allocator.resident_bytes()
            problem = self.engine.health(stall_s=self.spec.stall_s)
            if problem != said:
                self.send(("health", problem))
                said = problem


def main() -> None:
    # Ctrl-C reaches the whole process group: the replica handles it and closes the host.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s engine %(name)s: %(message)s")
    conn = Connection(int(sys.argv[1]))
    spec: HostSpec = conn.recv()
    try:
        host = Host(conn, spec)
    except Exception:
        conn.send(("failed", traceback.format_exc()))
        os._exit(1)
    conn.send(("ready", (ModelFacts.of(host.translator), host.state())))
    # Reports only once "ready" is sent: the engine's thread sends them, and one sent first would be read as
    # the ready message. The warm-up is not traffic either.
    host.engine.observer = Relay(host)
    threading.Thread(target=host.watch, name="beamserve-engine-watch", daemon=True).start()
    host.serve()
    os._exit(0)  # no waiting on daemon threads or torch's teardown


if __name__ == "__main__":
    # Run as the package's module, not as __main__: what it pickles names service.engine.engine_host's classes.
    from service.engine import engine_host

    engine_host.main()
