"""HAProxy's own answers in the request log, and every Ray worker's setup hook (`install`).

A request the front answered itself (413 by its Content-Length, 414, 431, 408, 503 past the queue or
with no replica up, 504, 400) never reaches a gateway replica, so no replica writes its line. HAProxy
sends a JSON line for every request to a datagram socket beside its admin socket (front.LOG_RULES), and
`FrontLog`, in the process that runs HAProxy, writes the ones no gateway answered to
`requests_haproxy_<pid>.log` beside the replicas' requests files, in their shape: time, request_id,
route (the route's template, as the gateway logs it: a path may hold a document's handle), method,
status, duration_s, and `front: "haproxy"` with HAProxy's termination state (its two letters say who
ended the request and why, e.g. `sQ` a queue timeout).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from service.api import front
from service.request_log import RequestFile

logger = logging.getLogger(__name__)


class FrontLog:
    """Reads HAProxy's lines from the datagram socket at `path` in a thread of its own and writes those of
    requests no gateway answered to `out`."""

    def __init__(self, path: str, out: RequestFile) -> None:
        self.path, self.out = path, out
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a socket left by a process before this one
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.routes: list[tuple[re.Pattern[str], str]] | None = None
        threading.Thread(target=self._run, name="beamserve-front-log", daemon=True).start()

    def _run(self) -> None:
        from service.api import gateway  # noqa: F401 (its import registers the routes on the app)
        from service.api.http import app

        self.routes = templates(app.router.routes)
        while True:
            try:
                data = self.sock.recv(front.LOG_LINE_BYTES + 1)
            except OSError:
                return  # closed
            try:
                self.record(data)
            except Exception:  # a line is never worth the reader
                logger.exception("HAProxy's log line could not be written: %r", data[:200])

    def record(self, data: bytes) -> None:
        """Write the line in `data` unless a gateway answered it (and so logged it itself), or it is not a
        request's: HAProxy sends its own notices to every log target too (a proxy stopped at a reload)."""
        if not data.startswith(b"{"):
            return
        try:
            line = orjson.loads(data.strip())
        except orjson.JSONDecodeError:
            line = None
        if not isinstance(line, dict):
            self.out.write({"time": round(time.time(), 3), "beamserve": "request", "front": "haproxy", "unparsed": 1})
            return
        if line.get("gateway") == "1":
            return
        method = line.get("method") or ""
        self.out.write(
            {
                "time": round(time.time(), 3),
                "beamserve": "request",
                "request_id": line.get("request_id") or "",
                "route": self.route(str(line.get("path") or "")),
                "method": method,
                "status": line.get("status"),
                "duration_s": max(0, line.get("duration_ms") or 0) / 1000,
                "front": "haproxy",
                "termination": line.get("termination") or "",
            }
        )

    def route(self, path: str) -> str:
        """The template of the app's route `path` matches, else "other" (never the path itself: it may hold
        an id or a secret)."""
        return next((template for regex, template in self.routes or () if regex.match(path)), "other")

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def templates(routes: list[Any]) -> list[tuple[re.Pattern[str], str]]:
    """(path regex, template) of each route, those of included routers too, in the order they match."""
    found: list[tuple[re.Pattern[str], str]] = []
    for r in routes:
        if isinstance(getattr(r, "path_regex", None), re.Pattern) and isinstance(getattr(r, "path", None), str):
            found.append((r.path_regex, r.path))
        inner = getattr(r, "original_router", None)  # how FastAPI holds an included router's routes
        if inner is not None:
            found += templates(list(inner.routes))
    return found


_running: FrontLog | None = None


def listen(admin_socket: str) -> None:
    """Start this process's FrontLog for the HAProxy whose admin socket is `admin_socket` (once)."""
    global _running
    if _running is not None:
        return
    from ray.serve._private.logging_utils import get_serve_logs_dir

    out = RequestFile(Path(get_serve_logs_dir()) / f"requests_haproxy_{os.getpid()}.log")
    try:
        _running = FrontLog(admin_socket + front.LOG_SOCKET_SUFFIX, out)
    except OSError:  # e.g. a path over the 107 bytes a socket's name may have: HAProxy's lines go nowhere
        logger.exception("HAProxy's own answers will not be in the request log")


def install() -> None:
    """Every Ray worker's setup hook (front.SETUP_HOOK): front.install(), and where Serve runs HAProxy, this
    log's reader started in the process that starts HAProxy, before HAProxy sends its first line."""
    front.install()
    if os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") != "1":
        return
    from ray.serve._private import haproxy

    if getattr(haproxy.HAProxyApi, "BEAMSERVE_LOG", False):
        return
    serve_start = haproxy.HAProxyApi.start

    async def start(api: haproxy.HAProxyApi) -> None:
        listen(api.cfg.socket_path)
        await serve_start(api)

    haproxy.HAProxyApi.start = start  # type: ignore[method-assign,assignment]
    haproxy.HAProxyApi.BEAMSERVE_LOG = True  # type: ignore[attr-defined]
