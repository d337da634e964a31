"""OpenTelemetry traces of requests, exported over OTLP/HTTP when `otlp_endpoint` is set, off otherwise.

One request's trace: the gateway's server span (continuing the client's W3C `traceparent`, answered in a
`traceresponse` header), its detection, memory and cache lookups, a client span per call to a pair's
model carrying the context to the replica (a `traceparent` carrier among the call's arguments), and the
replica's span with its tokenisation and, built afterwards from the engine's timestamps (`recorded`: the
engine's thread or process runs no tracing code), each batch its sentences shared: the wait in the queue,
the encoder's pass and the decoding with the batch's size and steps (RequestTiming.trace).

Each process sets up its own exporter (the gateway and model replicas: `setup`) and its own TracerProvider,
not the global one, so nothing else in the process (Ray's own tracing) is touched. Off, every helper
returns at once on one test of a module global: no span, no context object, no exporter thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from service.settings import Settings

logger = logging.getLogger(__name__)
OFF: AbstractContextManager[None] = contextlib.nullcontext()  # stateless: one shared by every call while off
TRACES_PATH = "/v1/traces"  # OTLP/HTTP's path for traces under a collector's base address
_tracer: Tracer | None = None
_propagator: Any = None
_provider: Any = None


def endpoint(configured: str) -> str:
    """The traces URL: `configured` (a collector's base address, or its full traces URL), else the
    OpenTelemetry environment's (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT whole, OTEL_EXPORTER_OTLP_ENDPOINT
    as a base); empty: tracing off."""
    url = configured or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
    if url:
        return url if url.rstrip("/").endswith(TRACES_PATH) else url.rstrip("/") + TRACES_PATH
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    return base.rstrip("/") + TRACES_PATH if base else ""


def setup(settings: Settings, component: str) -> None:
    """This process's tracer, exporting to the settings' endpoint (nothing when it has none, or when
    OTEL_SDK_DISABLED is true). `component`: gateway or model, the spans' resource says which."""
    global _tracer, _propagator, _provider
    url = endpoint(settings.otlp_endpoint)
    if not url or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true" or _tracer is not None:
        return
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    resource = Resource.create(
        {"service.name": os.environ.get("OTEL_SERVICE_NAME", "beamserve"), "beamserve.component": component}
    )
    provider = TracerProvider(resource=resource, sampler=ParentBased(TraceIdRatioBased(settings.trace_ratio)))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    _tracer, _propagator, _provider = provider.get_tracer("beamserve"), TraceContextTextMapPropagator(), provider
    logger.info("traces of %s of requests exported to %s", f"{settings.trace_ratio:.0%}", url)


def on() -> bool:
    return _tracer is not None


def recording() -> bool:
    """Whether the current span is traced (tracing on, and the request sampled): what only a trace uses is worth
    gathering."""
    if _tracer is None:
        return False
    from opentelemetry.trace import get_current_span

    return bool(get_current_span().is_recording())


def flush(timeout_s: float = 5.0) -> None:
    """Export the spans still held (a replica about to stop; the exporter's thread sends every 5 s)."""
    if _provider is not None:
        _provider.force_flush(int(timeout_s * 1000))


def span(name: str, **attributes: Any) -> AbstractContextManager[Any]:
    """A span of `name` under the current one, current while the block runs; OFF while tracing is off."""
    if _tracer is None:
        return OFF
    return _tracer.start_as_current_span(name, attributes=attributes or None)


def client_span(name: str, **attributes: Any) -> AbstractContextManager[Any]:
    """A span of a call to another process (carrier() inside it hands that process its context)."""
    if _tracer is None:
        return OFF
    from opentelemetry.trace import SpanKind

    return _tracer.start_as_current_span(name, kind=SpanKind.CLIENT, attributes=attributes or None)


def carrier() -> dict[str, str] | None:
    """The current span's context as W3C headers ({"traceparent": ...}), for a call to another process;
    None while tracing is off or nothing is traced."""
    if _tracer is None:
        return None
    out: dict[str, str] = {}
    _propagator.inject(out)
    return out or None


def continued(name: str, headers: Mapping[str, str] | None, **attributes: Any) -> AbstractContextManager[Any]:
    """A server span of `name` continuing the caller's context (carrier()'s headers, or an HTTP request's),
    current while the block runs; a new trace where the caller sent none."""
    if _tracer is None:
        return OFF
    from opentelemetry.trace import SpanKind

    context = _propagator.extract(headers) if headers else None
    return _tracer.start_as_current_span(
        name, context=context, kind=SpanKind.SERVER, attributes=attributes or None, record_exception=False
    )


def http_headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """The trace context's headers of an ASGI request (traceparent, tracestate)."""
    return {
        name.decode("latin-1"): value.decode("latin-1")
        for name, value in raw
        if name == b"traceparent" or name == b"tracestate"
    }


def traceresponse(current: Span) -> bytes:
    """The `traceresponse` header (W3C Trace Context Level 2) naming `current`: the client finds its trace
    by it, whether it sent a traceparent or not."""
    ctx = current.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}".encode()


def recorded(name: str, start: float, end: float, attributes: dict[str, Any] | None = None) -> None:
    """A span of `name` under the current one that began and ended at these monotonic times (taken where
    no tracing code runs: the engine's thread, or its own process, on one clock for every process of the
    host); nothing while tracing is off."""
    if _tracer is None:
        return
    offset = time.time_ns() - time.monotonic_ns()
    span = _tracer.start_span(name, start_time=int(start * 1e9) + offset, attributes=attributes)
    span.end(end_time=int(max(start, end) * 1e9) + offset)
