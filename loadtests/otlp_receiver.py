"""An OTLP/HTTP trace receiver on loopback, built on OpenTelemetry's own protobufs: what a collector's
`otlp` receiver takes (POST /v1/traces, `application/x-protobuf`, gzip or not), its spans kept for a test
or a benchmark to read, or printed as JSON lines:

    python loadtests/otlp_receiver.py --port 4318      # then BEAMSERVE_OTLP_ENDPOINT=http://127.0.0.1:4318
"""

from __future__ import annotations

import argparse
import gzip
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

MAX_BODY_BYTES = 64_000_000  # an exporter's batch is a few hundred kB; past this, 413


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str  # 32 hex digits
    span_id: str  # 16
    parent_span_id: str  # "" for a trace's root
    name: str
    kind: int  # the protobuf's SpanKind: 1 internal, 2 server, 3 client
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]  # service.name, beamserve.component...


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def decoded(body: bytes) -> list[ReceivedSpan]:
    """The spans of one ExportTraceServiceRequest."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    out = []
    for resource_spans in request.resource_spans:
        resource = {a.key: value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                out.append(
                    ReceivedSpan(
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex(),
                        name=s.name,
                        kind=int(s.kind),
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        attributes={a.key: value(a.value) for a in s.attributes},
                        resource=resource,
                    )
                )
    return out


class Receiver:
    """The server's spans, as they arrive (`on_span` is called with each, on the server's thread)."""

    def __init__(self, port: int = 0, on_span: Callable[[ReceivedSpan], None] | None = None) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                if self.path != "/v1/traces":
                    return self._answer(404, b"")
                if size > MAX_BODY_BYTES:
                    return self._answer(413, b"")
                body = self.rfile.read(size)
                if self.headers.get("Content-Encoding", "").lower() == "gzip":
                    body = gzip.decompress(body)
                try:
                    spans = decoded(body)
                except Exception:  # not an ExportTraceServiceRequest: the exporter's own 400
                    return self._answer(400, b"")
                with receiver._lock:
                    receiver.spans += spans
                    receiver.requests += 1
                for span in spans if on_span is not None else []:
                    on_span(span)
                self._answer(200, ExportTraceServiceResponse().SerializeToString())

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # one line per export is noise
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="otlp-receiver", daemon=True)

    def start(self) -> Receiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]


@contextmanager
def receiving(port: int = 0) -> Iterator[Receiver]:
    receiver = Receiver(port).start()
    try:
        yield receiver
    finally:
        receiver.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=4318, help="port on 127.0.0.1 (OTLP/HTTP's is 4318)")
    args = parser.parse_args()
    receiver = Receiver(args.port, on_span=lambda s: print(json.dumps(asdict(s)), flush=True))
    print(f"receiving OTLP/HTTP traces at {receiver.url}/v1/traces", flush=True)
    with suppress(KeyboardInterrupt):
        receiver.server.serve_forever()


if __name__ == "__main__":
    main()
