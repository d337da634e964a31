"""The metrics relay: Ray's loopback exporter served on another address, over real HTTP."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from service.metrics_relay import MetricsRelay

from .conftest import free_port

EXPOSITION = b"# TYPE beamserve_requests counter\nbeamserve_requests_total 3.0\n"


@pytest.fixture()
def exporter() -> Iterator[int]:
    """A stand-in for Ray's exporter on 127.0.0.1: a real HTTP server with a fixed exposition."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(EXPOSITION)))
            self.end_headers()
            self.wfile.write(EXPOSITION)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def test_relay_serves_the_exporter_on_its_own_address(exporter: int) -> None:
    relay = MetricsRelay("127.0.0.2", 0, exporter).start()  # 127.0.0.2: another address on loopback
    try:
        r = httpx.get(f"http://127.0.0.2:{relay.port}/metrics", timeout=10)
        assert r.status_code == 200 and r.content == EXPOSITION
        assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert httpx.get(f"http://127.0.0.2:{relay.port}/", timeout=10).status_code == 404
    finally:
        relay.stop()


def test_relay_answers_503_when_the_exporter_is_down() -> None:
    relay = MetricsRelay("127.0.0.1", 0, free_port()).start()
    try:
        r = httpx.get(f"http://127.0.0.1:{relay.port}/metrics", timeout=20)
        assert r.status_code == 503 and "did not answer" in r.text
    finally:
        relay.stop()
