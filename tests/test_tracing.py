"""Requests' OpenTelemetry traces (service/tracing.py), end to end: the shared server exports over OTLP/HTTP
to a real receiver (loadtests/otlp_receiver.py, OpenTelemetry's protobufs) the traces of the requests that
come with a sampled W3C traceparent; a trace's spans, from the gateway's, the replica's and the engine's
processes, must arrive with one trace id and each under its parent."""

from __future__ import annotations

import secrets

import httpx
import pytest

from loadtests.otlp_receiver import ReceivedSpan
from service import tracing
from tests.conftest import RECEIVER, wait_for

SERVER, CLIENT = 2, 3  # the protobuf's SpanKind


def traceparent() -> tuple[str, str, str]:
    """A sampled traceparent as a client would send it: (header, trace id, the client's span id)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def arrived(trace_id: str, names: set[str]) -> list[ReceivedSpan]:
    """The trace's spans once every one of `names` is among them (the exporters send every few seconds)."""
    receiver = RECEIVER[0]
    wait_for(lambda: names <= {s.name for s in receiver.trace(trace_id)}, f"spans {sorted(names)}", 30)
    return receiver.trace(trace_id)


def one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    (found,) = [s for s in spans if s.name == name]
    return found


def test_one_request_s_spans_arrive_under_one_trace_from_gateway_replica_and_engine(server: str) -> None:
    header, trace_id, client_span = traceparent()
    body = {
        "texts": ["A man is riding a bike down the street. Two dogs play in the snow."],
        "source": "en",
        "target": "de",
        "cache": False,
    }
    r = httpx.post(f"{server}/v1/translate", json=body, headers={"traceparent": header}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["traceresponse"].split("-")[1] == trace_id and sampled(r.headers["traceresponse"])
    names = {"POST /v1/translate", "call translate en-de", "translate en-de", "tokenize", "queue", "decode"}
    spans = arrived(trace_id, names | {"detokenize"})
    gateway, call = one(spans, "POST /v1/translate"), one(spans, "call translate en-de")
    replica = one(spans, "translate en-de")
    # Parentage across three processes: the client's span, the gateway's, its call, the replica's.
    assert (gateway.parent_span_id, gateway.kind) == (client_span, SERVER)
    assert (call.parent_span_id, call.kind) == (gateway.span_id, CLIENT)
    assert (replica.parent_span_id, replica.kind) == (call.span_id, SERVER)
    for name in ("tokenize", "queue", "decode", "detokenize"):
        assert one(spans, name).parent_span_id == replica.span_id, name
    assert gateway.resource["beamserve.component"] == "gateway" and replica.resource["beamserve.component"] == "model"
    assert gateway.attributes["http.response.status_code"] == 200
    assert gateway.attributes["http.route"] == "/v1/translate"
    decode = one(spans, "decode")
    assert decode.attributes["beamserve.sentences"] == 2 and decode.attributes["beamserve.batch.sentences"] >= 2
    assert decode.attributes["beamserve.output_tokens"] > 1
    # The engine's timestamps, taken in its own process, fall within the replica's span.
    queue = one(spans, "queue")
    assert replica.start_ns <= queue.start_ns <= queue.end_ns <= decode.start_ns <= decode.end_ns <= replica.end_ns
    assert gateway.start_ns <= call.start_ns <= replica.start_ns and replica.end_ns <= call.end_ns <= gateway.end_ns


def test_detection_and_the_cache_are_spans_and_a_cached_request_calls_no_replica(server: str) -> None:
    text = f"A woman with {secrets.randbelow(10**6)} red balloons walks along the beach."
    first, second = traceparent(), traceparent()
    for header, _, _ in (first, second):
        body = {"texts": [text], "target": "de"}  # no source: detected
        r = httpx.post(f"{server}/v1/translate", json=body, headers={"traceparent": header}, timeout=60)
        assert r.status_code == 200, r.text
    missed = arrived(first[1], {"detect", "cache", "call translate en-de"})
    assert one(missed, "cache").attributes["beamserve.cache.hits"] == 0
    hit = arrived(second[1], {"POST /v1/translate", "detect", "cache"})
    assert one(hit, "cache").attributes["beamserve.cache.hits"] == 1
    assert not [s for s in hit if s.name.startswith("call ")]


def test_a_request_without_a_sampled_traceparent_is_not_traced_at_ratio_zero(server: str) -> None:
    """The shared server traces no share of the other requests (trace_ratio 0): its answer names a trace
    not sampled, as does one whose client sent an unsampled traceparent."""
    body = {"texts": ["A cat."], "source": "en", "target": "de"}
    r = httpx.post(f"{server}/v1/translate", json=body, timeout=60)
    assert r.status_code == 200 and not sampled(r.headers["traceresponse"])
    trace_id = secrets.token_hex(16)
    unsampled = {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-00"}
    r = httpx.post(f"{server}/v1/translate", json=body, headers=unsampled, timeout=60)
    assert r.status_code == 200 and r.headers["traceresponse"].split("-")[1] == trace_id
    assert not sampled(r.headers["traceresponse"])


def sampled(header: str) -> bool:
    """The sampled bit of a traceparent's or traceresponse's flags (the others: W3C Level 2's random bit)."""
    return bool(int(header.split("-")[3], 16) & 1)


@pytest.mark.parametrize(
    ("configured", "environment", "url"),
    [
        ("", {}, ""),
        ("http://collector:4318", {}, "http://collector:4318/v1/traces"),
        ("http://collector:4318/v1/traces", {}, "http://collector:4318/v1/traces"),
        ("", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, "http://c:4318/v1/traces"),
        ("", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:9/v1/traces"}, "http://c:9/v1/traces"),
    ],
)
def test_the_endpoint_is_the_setting_or_opentelemetry_s_environment(
    configured: str, environment: dict[str, str], url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert tracing.endpoint(configured) == url


def test_off_every_helper_answers_without_building_a_span() -> None:
    """This process has no tracer (nothing set it up): what the hot path calls returns at once."""
    assert not tracing.on()
    assert tracing.span("x") is tracing.OFF and tracing.client_span("x") is tracing.OFF
    assert tracing.continued("x", {"traceparent": traceparent()[0]}) is tracing.OFF
    assert tracing.carrier() is None
