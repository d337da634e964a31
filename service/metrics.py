"""Every metric of the service, defined in one place and exported through Ray's metrics pipeline.

`ray.serve.metrics` sends each replica's values to its node's metrics agent, so one scrape of the
node's export port (`beamserve serve --metrics-port`, default 8080) sees every replica, which a
replica-local prometheus_client registry would not. Names appear with Ray's `ray_` prefix and Serve
adds `deployment`, `replica` and `application` labels. Our labels stay bounded: endpoint, pair,
status; never a request, address or text.

Ray exports histogram `_sum` approximately, from bucket midpoints, so buckets are dense where values
fall (latencies from 5 ms to 30 s, batch sizes 1..64) and `_sum`/`_count` means are rough; use
`histogram_quantile` over `_bucket` for percentiles.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from typing import Any

LATENCY_S = [0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 30]
QUEUE_WAIT_S = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30]
BATCH_SENTENCES: list[float] = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128]
STEP_ROWS: list[float] = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512]
BATCH_TOKENS: list[float] = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
FLUSH_S = 0.5  # counts reach Ray's metrics within this long (Ray exports every few seconds)
PADDING_RATIO = [1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 1.75, 2, 3, 5]
# Ray's metrics agent drops a gauge not set again within two export intervals (each at least 1 s): an idle
# replica's model info, capacity and load time would leave the scrape, and alerts reading ratios with them.
GAUGE_REFRESH_S = 1.0


class GatewayMetrics:
    """Requests by endpoint, pair and status, and their latency (recorded by the ingress)."""

    def __init__(self) -> None:
        from ray.serve.metrics import Counter, Histogram

        keys: Any = ("endpoint", "pair", "status")  # Ray's stubs say tuple[str]; any length works
        self.requests = Counter(
            "beamserve_requests", description="HTTP requests by endpoint, pair and status.", tag_keys=keys
        )
        self.latency = Histogram(
            "beamserve_request_latency_seconds",
            description="End-to-end request latency.",
            boundaries=LATENCY_S,
            tag_keys=keys,
        )

        self.cache_lookups = Counter(
            "beamserve_cache_sentences",
            description="Sentences looked up in the gateway's translation cache, by pair and result (hit, miss).",
            tag_keys=("pair", "result"),  # type: ignore[arg-type]
        )

        # Counts add up here and go to Ray at most every FLUSH_S: a Ray counter's inc costs a request
        # about 10 us, and Ray exports every REPORT_S anyway. (counter, tags as a tuple) -> count
        self.pending: dict[tuple[Any, tuple[tuple[str, str], ...]], int] = {}
        self.timer: asyncio.TimerHandle | None = None

    def observe(self, endpoint: str, pair: str, status: int, seconds: float) -> None:
        tags = (("endpoint", endpoint), ("pair", pair), ("status", str(status)))
        self.latency.observe(seconds, dict(tags))
        self._count(self.requests, tags, 1)

    def on_cache(self, pair: str, hits: int, misses: int) -> None:
        if hits:
            self._count(self.cache_lookups, (("pair", pair), ("result", "hit")), hits)
        if misses:
            self._count(self.cache_lookups, (("pair", pair), ("result", "miss")), misses)

    def _count(self, counter: Any, tags: tuple[tuple[str, str], ...], n: int) -> None:
        key = (counter, tags)
        self.pending[key] = self.pending.get(key, 0) + n
        if self.timer is None:
            try:
                self.timer = asyncio.get_running_loop().call_later(FLUSH_S, self.flush)
            except RuntimeError:  # no event loop: at once
                self.flush()

    def flush(self) -> None:
        self.timer = None
        pending, self.pending = self.pending, {}
        for (counter, tags), n in pending.items():
            counter.inc(n, dict(tags))


_gateway: GatewayMetrics | None = None


def gateway_metrics() -> GatewayMetrics:
    """The ingress replica's metrics, created on first use inside the replica process.

    A module-level accessor rather than state on the FastAPI app: Serve pickles the ingress class by
    value, so module globals of service.app may be copies, while this module is imported by name.
    """
    global _gateway
    if _gateway is None:
        _gateway = GatewayMetrics()
    return _gateway


class ModelMetrics:
    """One pair's batching, tokens, queue and device metrics (recorded by the model replica)."""

    def __init__(self, pair: str) -> None:
        from ray.serve.metrics import Counter, Gauge, Histogram

        def metric(kind: Any, name: str, description: str, boundaries: list[float] | None = None) -> Any:
            extra = {"boundaries": boundaries} if boundaries is not None else {}
            m = kind(name, description=description, tag_keys=("pair",), **extra)
            m.set_default_tags({"pair": pair})
            return m

        H, C, G = Histogram, Counter, Gauge
        self.queue_wait = metric(
            H, "beamserve_queue_wait_seconds", "Time a sentence waited before it started decoding.", QUEUE_WAIT_S
        )
        self.batch_sentences = metric(H, "beamserve_batch_sentences", "Sentences per batch.", BATCH_SENTENCES)
        self.batch_tokens = metric(H, "beamserve_batch_tokens", "Padded source tokens per batch.", BATCH_TOKENS)
        self.padding = metric(
            H, "beamserve_batch_padding_ratio", "Padded / real source tokens per batch (1.0 = no waste).", PADDING_RATIO
        )
        self.source_tokens = metric(C, "beamserve_source_tokens", "Source tokens decoded.")
        self.generated_tokens = metric(
            C, "beamserve_generated_tokens", "Target tokens generated (best hypothesis, </s> included)."
        )
        self.batches = metric(
            C,
            "beamserve_batches",
            "Batches decoded (continuous batching: admissions, sentences joining the running batch together).",
        )
        self.steps = metric(C, "beamserve_decode_steps", "Decoder steps run (continuous batching).")
        self.step_rows = metric(
            H,
            "beamserve_step_rows",
            "Hypothesis rows (beams of all sentences in flight) per decoder step.",
            STEP_ROWS,
        )
        self.rejected = metric(
            C,
            "beamserve_rejected_requests",
            "Requests (not sentences) the replica refused with 503: queue full or too much work ahead.",
        )
        self.timeouts = metric(C, "beamserve_expired_sentences", "Sentences dropped past their deadline (504).")
        self.cancelled = metric(
            C, "beamserve_cancelled_sentences", "Sentences withdrawn by a client that went away, queued or decoding."
        )
        # Each gauge of work beside its capacity, so alerts and dashboards read ratios whatever the device.
        self.queue_depth = metric(G, "beamserve_queued_sentences", "Sentences waiting to start decoding.")
        self.queue_capacity = metric(
            G,
            "beamserve_queue_capacity_sentences",
            "Sentences the replica's queue holds at most (max_queue); past it, 503.",
        )
        self.active = metric(G, "beamserve_active_sentences", "Sentences decoding now (slots in use).")
        self.slots = metric(
            G,
            "beamserve_decode_slots",
            "Sentences the replica decodes at once at most (decode_slots, continuous batching).",
        )
        self.info = Gauge(
            "beamserve_model_info",
            description="1 for the model a replica serves: its pair, content digest, compute type and device.",
            tag_keys=("pair", "digest", "compute_type", "device"),  # type: ignore[arg-type]
        )
        self.info_tags: dict[str, str] = {"pair": pair, "digest": "", "compute_type": "", "device": ""}
        self.load_seconds = metric(G, "beamserve_model_load_seconds", "Model load time of the replica.")
        self.gpu_memory = metric(G, "beamserve_gpu_memory_allocated_bytes", "GPU memory allocated by torch (0 on CPU).")
        self._seen = {"rejected": 0, "expired": 0, "cancelled": 0}
        self.load_time = 0.0
        self._gauges_set = 0.0  # when the gauges last went to Ray (by a flush or GaugeRefresher)
        self._gauges_lock = threading.Lock()  # the engine's flushes and the refresher's thread both set them
        self._open = True  # until closed(): then no thread sets them again
        self.capacity = (0, 0)  # (max_queue, decode_slots), set by the replica on (re)configuration
        # Reports not yet recorded in Ray's metrics (on_batch, on_step, on_generated, sync): see FLUSH_S
        self._batches: list[tuple[int, int, int, list[float]]] = []
        self._rows: list[int] = []
        self._generated = 0
        self._state: tuple[int, int, int, int, int, int] | None = None
        self._flushed = 0.0
        self._unsent = False  # reports or gauges not yet recorded in Ray's metrics

    def closed(self) -> None:
        """The model left its replica (a pool evicted it): its info and gauges say so."""
        _refresher.discard(self)
        with self._gauges_lock:
            self._open = False
            self.info.set(0, self.info_tags)
            for gauge in (self.queue_depth, self.active, self.queue_capacity, self.slots):
                gauge.set(0)

    # The engine's thread reports every decoder step; a Ray metric's record costs about 3 us, a dozen of them
    # a step (8% of a one-sentence int8 step on one core). So the reports add up here and reach Ray at most
    # every FLUSH_S, and FLUSH_S after the last when the engine goes idle; Ray exports every few seconds anyway.

    def on_batch(self, sentences: int, padded: int, real: int, waits: list[float]) -> None:
        self._batches.append((sentences, padded, real, waits))
        self._unsent = True

    def on_step(self, rows: int) -> None:
        self._rows.append(rows)
        self._unsent = True

    def on_generated(self, tokens: int) -> None:
        self._generated += tokens
        self._unsent = True

    def sync(
        self, stats: Any, queued: int, active: int, gpu_bytes: int, *, idle: bool = False, due: bool = False
    ) -> float | None:
        """Take the engine's cumulative counts and current gauges; to Ray once FLUSH_S has passed since they last
        went. Idle, returns how long until then (the engine waits no longer), or None with nothing new to send:
        a flush as the engine goes idle would hold the GIL while the replica answers the request just done."""
        state = (stats.rejected, stats.expired, stats.cancelled, queued, active, gpu_bytes)
        self._unsent |= state != self._state
        self._state = state
        now = time.monotonic()
        if (due or now - self._flushed >= FLUSH_S) and self._unsent:
            self._flushed = now
            self._flush()
            self._unsent = False
            return None
        return FLUSH_S - (now - self._flushed) if idle and self._unsent else None

    def _flush(self) -> None:
        batches, self._batches = self._batches, []
        rows, self._rows = self._rows, []
        generated, self._generated = self._generated, 0
        for sentences, padded, real, waits in batches:
            self.batches.inc(1)
            self.batch_sentences.observe(sentences)
            self.batch_tokens.observe(padded)
            self.padding.observe(padded / max(real, 1))
            self.source_tokens.inc(real)
            for wait in waits:
                self.queue_wait.observe(wait)
        if rows:
            self.steps.inc(len(rows))
        for n in rows:
            self.step_rows.observe(n)
        if generated:
            self.generated_tokens.inc(generated)
        if self._state is not None:
            counters = (self.rejected, self.timeouts, self.cancelled)
            for name, now, counter in zip(("rejected", "expired", "cancelled"), self._state[:3], counters, strict=True):
                if now > self._seen[name]:
                    counter.inc(now - self._seen[name])
                    self._seen[name] = now
        self.set_gauges()

    def set_gauges(self) -> None:
        """Every gauge to Ray from the last values the engine reported, until closed."""
        with self._gauges_lock:
            if not self._open:
                return
            self._gauges_set = time.monotonic()
            queued, active, gpu_bytes = self._state[3:] if self._state is not None else (0, 0, 0)
            self.load_seconds.set(self.load_time)
            self.info.set(1, self.info_tags)
            self.queue_capacity.set(self.capacity[0])
            self.slots.set(self.capacity[1])
            self.queue_depth.set(queued)
            self.active.set(active)
            self.gpu_memory.set(gpu_bytes)

    def refresh(self, now: float) -> None:
        if now - self._gauges_set >= GAUGE_REFRESH_S:
            self.set_gauges()

    def serving(self) -> None:
        """The model is loaded and its facts set: its gauges go to Ray from now on, traffic or none."""
        self.set_gauges()
        _refresher.add(self)


class GaugeRefresher:
    """One daemon thread per process setting every serving model's gauges again once GAUGE_REFRESH_S passes
    without a flush having set them (an idle engine flushes nothing); some 30 us a model a second."""

    def __init__(self) -> None:
        self.models: weakref.WeakSet[ModelMetrics] = weakref.WeakSet()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def add(self, model: ModelMetrics) -> None:
        with self.lock:
            self.models.add(model)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="metrics-gauges", daemon=True)
                self.thread.start()

    def discard(self, model: ModelMetrics) -> None:
        with self.lock:
            self.models.discard(model)

    def _run(self) -> None:
        while True:
            time.sleep(GAUGE_REFRESH_S / 2)
            with self.lock:
                models = list(self.models)
            now = time.monotonic()
            for model in models:
                model.refresh(now)


_refresher = GaugeRefresher()
