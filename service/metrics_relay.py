"""Serve Ray's Prometheus metrics on another address than Ray's own loopback exporter.

A loopback-only Ray instance (service/local_ray.py) exports metrics on 127.0.0.1 alone. An operator
who wants them scraped from elsewhere (the Docker image) sets BEAMSERVE_METRICS_HOST; this relay then
listens there and answers GET /metrics from the loopback exporter, so exposing metrics never exposes
Ray's control plane.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

UPSTREAM_TIMEOUT_S = 10.0


class MetricsRelay:
    """GET /metrics on (host, port), fetched from http://127.0.0.1:{upstream_port}/metrics."""

    def __init__(self, host: str, port: int, upstream_port: int) -> None:
        upstream = f"http://127.0.0.1:{upstream_port}/metrics"

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    return self._answer(404, b"only /metrics is served here\n", "text/plain")
                try:
                    with urllib.request.urlopen(upstream, timeout=UPSTREAM_TIMEOUT_S) as r:
                        body, kind = r.read(), r.headers.get("Content-Type", "text/plain")
                except (urllib.error.URLError, TimeoutError) as exc:
                    return self._answer(503, f"Ray's metrics exporter did not answer: {exc}\n".encode(), "text/plain")
                self._answer(200, body, kind)

            def _answer(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:  # scrapes every few seconds: not worth a log line
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, name="metrics-relay", daemon=True)

    def start(self) -> MetricsRelay:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
