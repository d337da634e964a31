"""The HTTP front: what answers on the server's port before the gateway replica does.

`haproxy` (the default): Ray Serve's high-throughput mode. HAProxy (C) takes the connections and
forwards each request to a gateway replica's own HTTP server, and deployments call each other over
gRPC. `serve`: Serve's Python HTTP proxy, which hands each request to the gateway over Ray.
docs/benchmarks.md#serving-path has what each costs a request.

Serve generates HAProxy's configuration; `install()` (run in every Ray worker, the HAProxy manager's
among them) adds beamserve's part to the template:
- every listener HAProxy opens on loopback but the API's (its stats page and Prometheus exporter
  would otherwise listen on every interface; Serve's HAProxy metrics reach Prometheus through Ray);
- every answer HAProxy makes itself is JSON in the route's API shape with the request id: a dead
  gateway replica (502, 503) is a 503 `replica_unavailable` with Retry-After, never a plain 500;
- each request gets an X-Request-ID (the client's, else a new one) that the gateway and every error
  body repeat;
- refusals that cost no Python: a body over max_body_bytes by its Content-Length (413), a URL over
  MAX_URL_BYTES (414), a header block over MAX_HEADER_BYTES or MAX_HEADERS fields (431), headers and
  small bodies that stop arriving (408, body_timeout_s), and at most max_in_flight requests on a
  gateway replica at once; past that, up to max_queued per replica wait in HAProxy's queue (at most
  QUEUE_S) and the rest get 503 `overloaded` (429 on LibreTranslate's and DeepL's routes, as their
  clients expect) at once;
- a request whose gateway replica died before answering (an empty response) is sent again once to
  another replica, or to Serve's proxy while none is up: a translation has no side effect;
- every request a JSON line to a datagram socket beside HAProxy's admin socket, from which
  service/api/front_log.py writes those HAProxy answered itself to the request log.

The limits travel to Ray's processes as BEAMSERVE_* environment variables (set by `environment()`
before Ray starts, or by the pod's environment on Kubernetes).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from service.error_codes import RETRY_AFTER_S, status_of

if TYPE_CHECKING:
    from service.settings import Front, Settings

QUEUE_S = 1  # a request waits at most this long in HAProxy's queue for a gateway slot
BUFFERED_BODY_BYTES = 8192  # bodies up to this size reach the gateway whole (HAProxy buffers them)
# A request's head (request line and headers) up to MAX_URL_BYTES + MAX_HEADER_BYTES is refused in the
# route's JSON shape; HAProxy 2.8 answers a head it cannot parse (larger than its buffer, or over
# tune.http.maxhdr fields) with its own HTML 400 before any rule or error file applies, so its buffer
# and field limit are set well past what is refused. A buffer is held per request in flight, not per
# connection: this is 80 KB against Serve's 16 KB while a request's head or body is being read.
# The routes that take a document upload, whose body may be up to max_document_bytes (max_body_bytes elsewhere).
DOCUMENT_PATHS = ("/v2/document", "/translate_file", "/v1/memories")  # and a TMX file's
MAX_URL_BYTES = 16_384  # path and query; past it 414 uri_too_long
MAX_HEADER_BYTES = 32_768  # every header line together; past it 431 headers_too_large
MAX_HEADERS = 100  # header fields; past it 431 headers_too_large
HEAD_BUFFER_BYTES = 81_920  # HAProxy's tune.bufsize: a 70 KB URL or a 64 KB cookie still parses
PARSED_HEADERS = 1_000  # HAProxy's tune.http.maxhdr: a head of this many fields still parses
RETRIES = 20  # connection attempts past the first; see environment()
SERVER_GRACE_S = 10  # HAProxy answers 504 when a gateway replica is silent this long past request_timeout_s
DEREGISTER_S = 2  # a stopping gateway replica answers this long after HAProxy is told to stop using it
PROXY_READY_S = 30  # how long a starting proxy may take to answer Serve's readiness check
UNAVAILABLE_S = RETRY_AFTER_S["replica_unavailable"]
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """The settings HAProxy enforces (service/settings.py describes each)."""

    max_in_flight: int
    max_queued: int
    max_body_bytes: int
    max_document_bytes: int
    body_timeout_s: float
    request_timeout_s: float


def environment(front: Front, limits: Limits) -> dict[str, str]:
    """What Ray's processes need in their environment for this front (set before Ray starts)."""
    env = {
        "BEAMSERVE_PROXY": front,
        "BEAMSERVE_MAX_IN_FLIGHT": str(limits.max_in_flight),
        "BEAMSERVE_MAX_QUEUED": str(limits.max_queued),
        "BEAMSERVE_MAX_BODY_BYTES": str(limits.max_body_bytes),
        "BEAMSERVE_MAX_DOCUMENT_BYTES": str(limits.max_document_bytes),
        "BEAMSERVE_BODY_TIMEOUT_S": str(limits.body_timeout_s),
        "BEAMSERVE_REQUEST_TIMEOUT_S": str(limits.request_timeout_s),
        "RAY_SERVE_LOG_TO_STDERR": "0",  # replicas log to their files, nothing through the driver
        # Serve's replicas and handles hand their request counts and latencies to Ray's metrics each
        # second, not each 0.1 s: Ray exports them every few seconds, and at 0.1 s the replica's loop was
        # 11% of a decoded request's path in the gateway (py-spy, 18 requests a second on 2 cores).
        "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000",
        # Serve's controller kills a proxy (HAProxy's manager included) not ready within this: its worker's
        # start and HAProxy's count, and on a busy node they passed Serve's default of 5 s.
        "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": str(PROXY_READY_S),
    }
    if front == "haproxy":
        env |= {
            "RAY_SERVE_ENABLE_HA_PROXY": "1",
            "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
            "RAY_SERVE_HAPROXY_TUNE_BUFSIZE": str(HEAD_BUFFER_BYTES),
            # A request its gateway replica died holding (an empty response) goes again; enough tries
            # that the last ones find the replica marked down and go to another, or to Serve's proxy.
            "RAY_SERVE_HAPROXY_RETRY_ON": "conn-failure empty-response",
            "RAY_SERVE_HAPROXY_RETRIES": str(RETRIES),
            # A gateway answers within request_timeout_s (504 past it); one that does not is wedged.
            "RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S": str(math.ceil(limits.request_timeout_s) + SERVER_GRACE_S),
            # A stopping gateway replica stays up this long for HAProxy to take it out (Serve's default
            # of 30 s is for load balancers on other hosts; beamserve has drained its requests by then).
            "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": str(DEREGISTER_S),
        }
    return env


# Ray's worker setup hook given as an environment variable: a module path each Ray worker imports and
# calls at start (ray.init's runtime_env worker_process_setup_hook sets the same variable).
SETUP_HOOK_ENV = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"
SETUP_HOOK = "service.api.front_log.install"  # install() below, and the HAProxy log's reader


def cluster_environment(limits: Limits) -> dict[str, str]:
    """What every node of a cluster started with `ray start` (KubeRay's pods) needs in its environment:
    the HAProxy front's variables, and SETUP_HOOK as every Ray worker's setup hook, so that Serve's
    proxy and HAProxy manager, created by Serve's controller, carry beamserve's part on a cluster too.
    deploy/k8s/base/rayservice.yaml lists these (tests/test_k8s.py keeps them equal)."""
    return environment("haproxy", limits) | {SETUP_HOOK_ENV: SETUP_HOOK}


def limits_from_environment() -> Limits:
    from service.settings import Settings

    return limits_of(Settings())


def limits_of(s: Settings) -> Limits:
    return Limits(
        s.max_in_flight, s.max_queued, s.max_body_bytes, s.max_document_bytes, s.body_timeout_s, s.request_timeout_s
    )


# HAProxy log-format pieces: the request id as a JSON string's content, and the keys each API's
# clients read an error's code and message from (set per route in FRONTEND_RULES).
RID = "%[var(txn.request_id),json(utf8s)]"


def _error_body(code: str, detail: str) -> str:
    """An error body in the route's API shape, as an HAProxy log-format string."""
    body = f'{{"%[var(txn.code_key,error)]":"{code}","%[var(txn.detail_key,detail)]":"{detail}","request_id":"{RID}"}}'
    return body.replace('"', '\\"')


def _http_error(status: int, code: str, detail: str, retry_after: int | None = None, answered: int = 0) -> str:
    """HAProxy's answer for its own `status` as the error `code`, whose status (error_codes.CODES) the client
    gets: `status`, or `answered` where a rule below changes it."""
    assert status_of(code) == (answered or status), (code, status)
    retry = f" hdr retry-after {retry_after}" if retry_after is not None else ""
    return (
        f'    http-error status {status} content-type application/json lf-string "{_error_body(code, detail)}"'
        f" hdr x-request-id %[var(txn.request_id)]{retry}\n"
    )


def _defaults(limits: Limits) -> str:
    """The defaults section's answers for what HAProxy refuses or cannot deliver."""
    return (
        "    # beamserve: HAProxy's own answers in the API's JSON shape (service/api/front.py)\n"
        + _http_error(400, "malformed_request", "the request is not valid HTTP")
        + _http_error(408, "body_timeout", "the request did not arrive in time")
        + _http_error(413, "body_too_large", f"request body over {limits.max_body_bytes} bytes")
        + _http_error(502, "replica_unavailable", "the gateway replica stopped while answering", UNAVAILABLE_S, 503)
        + _http_error(503, "replica_unavailable", "no gateway replica took the request in time", UNAVAILABLE_S)
        + _http_error(504, "timeout", "no answer within the server's time", RETRY_AFTER_S["timeout"])
    )


# Every request's JSON line, to the datagram socket at HAProxy's admin socket path + LOG_SOCKET_SUFFIX
# (and to Serve's log targets, whose own fields are in their structured data): the request's path (its
# first 512 bytes, so a line over a 16 KB URL stays whole JSON) and method kept for it (a log line cannot
# read the request), its request id (the first 256 bytes: a client's X-Request-ID may be 32 KB, and a line
# past LOG_LINE_BYTES arrives cut, no longer JSON), and whether a gateway answered (each of its answers
# carries Server-Timing, service/api/http.py). service/api/front_log.py reads them.
LOG_SOCKET_SUFFIX = ".requests"
LOG_LINE_BYTES = 4096
_LOG_FIELDS = (
    '{"request_id":"%[var(txn.request_id),bytes(0,256),json(utf8s)]","path":"%[var(txn.path),bytes(0,512),json(utf8s)]",'
    '"method":"%[var(txn.method),json(utf8s)]","status":%ST,"duration_ms":%Ta,"termination":"%ts",'
    '"gateway":"%[var(txn.gateway)]"}'
)
LOG_RULES = (
    f"    log {{{{ config.socket_path }}}}{LOG_SOCKET_SUFFIX} len {LOG_LINE_BYTES} format raw local2 info\n"
    "{%- if not config.metrics_enabled %}\n"
    "    log global\n"
    "{%- endif %}\n"
    f'    log-format "{_LOG_FIELDS.replace(chr(34), chr(92) + chr(34))}"\n'
    "    http-request set-var(txn.path) path\n"
    "    http-request set-var(txn.method) method\n"
    "    http-after-response set-var(txn.gateway) str(1) if { res.hdr(server-timing) -m found }\n"
)


def _frontend(limits: Limits) -> str:
    """Rules of the API's frontend, before any routing: the request id, the API's error keys, limits."""
    from service.api import deepl, libretranslate

    libre = " ".join(sorted(libretranslate.ROUTES))
    return (
        "    # beamserve: request ids, the route's error shape and the front's limits (service/api/front.py)\n"
        + LOG_RULES
        + f"    timeout http-request {max(1, round(limits.body_timeout_s))}s\n"
        "    unique-id-format %[uuid]\n"
        + _undecodable_headers()
        + "    http-request set-header x-request-id %[unique-id] if !{ req.hdr(x-request-id) -m found }\n"
        "    http-request set-var(txn.request_id) req.hdr(x-request-id)\n"
        # The client's address as this front sees it and the X-Forwarded-For it sent, under names of their own
        # (service/api/client_address.py believes the second only from a trusted proxy); X-Forwarded-For itself
        # goes, so that the gateway's HTTP server does not take a client's word for its address.
        "    http-request set-header x-beamserve-peer %[src]\n"
        "    http-request del-header x-beamserve-forwarded-for\n"
        "    http-request set-header x-beamserve-forwarded-for %[req.fhdr(x-forwarded-for)]"
        " if { req.fhdr(x-forwarded-for) -m found }\n"
        "    http-request del-header x-forwarded-for\n"
        "    http-request set-var(txn.api) str(beamserve)\n"
        f"    http-request set-var(txn.api) str(deepl) if {{ path_beg {' '.join(deepl.PREFIXES)} }}\n"
        f"    http-request set-var(txn.api) str(libretranslate) if {{ path {libre} }}\n"
        "    http-request set-var(txn.code_key) str(error)\n"
        "    http-request set-var(txn.detail_key) str(detail)\n"
        "    http-request set-var(txn.code_key) str(code) if !{ var(txn.api) -m str beamserve }\n"
        "    http-request set-var(txn.detail_key) str(message) if { var(txn.api) -m str deepl }\n"
        "    http-request set-var(txn.detail_key) str(error) if { var(txn.api) -m str libretranslate }\n"
        + _http_return(400, "invalid_header", BAD_HEADER, " if { var(txn.bad_header) -m found }")
        + _head_limits()
        + f"    acl beamserve_document path {' '.join(DOCUMENT_PATHS)}\n"
        + _http_return(
            413,
            "body_too_large",
            f"document over {limits.max_document_bytes} bytes",
            f" if beamserve_document {{ req.hdr_val(content-length) gt {limits.max_document_bytes} }}",
        )
        + "    http-request deny deny_status 413 if !beamserve_document"
        f" {{ req.hdr_val(content-length) gt {limits.max_body_bytes} }}\n"
        # A dead replica is not the client's 502: Serve starts another, so retry.
        "    http-after-response set-status 503 if { status 502 }\n"
        # The body before the request goes on (408 past body_timeout_s): a replica's slot is never held
        # by a slow client, and a request whose replica dies can be sent again whole.
        f"    http-request wait-for-body time {max(1, round(limits.body_timeout_s))}s\n"
        "    http-after-response set-header x-request-id %[var(txn.request_id)]"
        " if !{ res.hdr(x-request-id) -m found }\n"
    )


BAD_HEADER = "the %[var(txn.bad_header)] header is not UTF-8"


def _head_limits() -> str:
    """414 and 431 for a request line or header block past beamserve's limits, in the route's shape."""
    fields = f"over {MAX_HEADERS} header fields or {MAX_HEADER_BYTES} bytes of headers"
    headers = f"{{ req.hdr_cnt gt {MAX_HEADERS} }} or {{ req.hdrs,length gt {MAX_HEADER_BYTES} }}"
    return _http_return(
        414, "uri_too_long", f"the URL is over {MAX_URL_BYTES} bytes", f" if {{ url,length gt {MAX_URL_BYTES} }}"
    ) + _http_return(431, "headers_too_large", fields, f" if {headers}")


def _http_return(status: int, code: str, detail: str, tail: str = "") -> str:
    """An `http-request return` of the error `code` in the route's shape; `tail` adds headers or a condition."""
    assert status_of(code) == status, (code, status)
    return (
        f'    http-request return status {status} content-type application/json lf-string "{_error_body(code, detail)}"'
        f" hdr x-request-id %[var(txn.request_id)]{tail}\n"
    )


def serve_decoded_headers() -> list[str]:
    """Headers Serve decodes as UTF-8 in the replica, answering a plain-text 500 when one is not, named
    as Serve's constants name them (its affinity header is an operator's setting): the request id, the
    request timeout, the disconnect switch, and the affinity and model id headers with "-" or "_" alike,
    as Serve matches those two."""
    from ray.serve._private import constants as c

    names = [
        c.SERVE_HTTP_REQUEST_ID_HEADER,
        c.SERVE_HTTP_REQUEST_TIMEOUT_S_HEADER,
        c.SERVE_HTTP_REQUEST_DISCONNECT_DISABLED_HEADER,
    ]
    for name in (c.SERVE_SESSION_ID, c.SERVE_MULTIPLEXED_MODEL_ID):
        names += [name.replace("_", "-"), name.replace("-", "_")]
    return names


def _undecodable_headers() -> str:
    """Mark a request whose Serve-decoded header is not UTF-8 (answered 400 once the route's error
    shape is known); an undecodable request id is replaced, so the answer still has one."""
    rules = []
    for name in serve_decoded_headers():
        sent, utf8 = f"{{ req.fhdr({name}) -m found }}", f"{{ req.fhdr({name}),json(utf8) -m found }}"
        rules.append(f"    http-request set-var(txn.bad_header) str({name}) if {sent} !{utf8}\n")
    fresh = "    http-request set-header x-request-id %[unique-id] if { var(txn.bad_header) -m str x-request-id }\n"
    return "".join(rules) + fresh


def _backend(limits: Limits) -> str:
    """Rules of each application backend: past the queue it may hold, refused at once (probes wait)."""
    overloaded = _error_body("overloaded", "the server is at capacity; retry shortly")
    answer = (
        f'content-type application/json lf-string "{overloaded}" hdr retry-after 1'
        " hdr x-request-id %[var(txn.request_id)] if beamserve_full !beamserve_probe"
    )
    return (
        "    # beamserve: past the queue it may hold, refused at once (service/api/front.py)\n"
        f"    timeout queue {QUEUE_S}s\n"
        # nbsrv counts the replicas up; one more keeps a queue while the only replica restarts.
        f"    http-request set-var(txn.queue_cap) nbsrv(),add(1),mul({limits.max_queued})\n"
        "    acl beamserve_full queue(),sub(txn.queue_cap) ge 0\n"
        "    acl beamserve_probe path /healthz /readyz\n"
        # LibreTranslate's and DeepL's clients take 429 as "slow down" (service/api/deepl.py, libretranslate.py).
        f"    http-request return status 429 {answer} !{{ var(txn.api) -m str beamserve }}\n"
        f"    http-request return status 503 {answer}\n"
    )


def _no_route() -> str:
    """What a path no application's prefix holds gets: a JSON 404 with its request id; and while this
    front has no application's routes at all (a proxy just started, its head restarting, the app not
    yet deployed), a JSON 503 with Retry-After, since the path will be served in a moment."""

    return (
        "{%- if backends %}\n"
        + _http_return(404, "not_found", "no route for this path")
        + "{%- else %}\n"
        + _http_return(
            503, "starting", "the server is starting; retry shortly", f" hdr retry-after {RETRY_AFTER_S['starting']}"
        )
        + "{%- endif %}\n"
    )


# (what Serve's template says, what beamserve's says instead); each must be found exactly once.
def _edits(limits: Limits) -> list[tuple[str, str]]:
    return [
        (
            "    http-request return status 404 content-type text/plain lf-string \"Path '%[path]' not found."
            ' Ping http://.../-/routes for available routes."\n',
            _no_route(),
        ),
        ("    bind :{{ config.metrics_port }}\n", "    bind 127.0.0.1:{{ config.metrics_port }}\n"),
        (
            "    nbthread {{ config.nbthread }}\n",
            f"    nbthread {{{{ config.nbthread }}}}\n    tune.http.maxhdr {PARSED_HEADERS}\n",
        ),
        ("  bind *:{{ config.stats_port }}\n", "  bind 127.0.0.1:{{ config.stats_port }}\n"),
        (
            "    # Normalize 502/503/504 to 500 per Serve's default behavior. 503\n"
            '    # covers HAProxy\'s own "all retries exhausted / no server" response.\n'
            "    {%- if config.error_file_path %}\n"
            "    errorfile 502 {{ config.error_file_path }}\n"
            "    errorfile 503 {{ config.error_file_path }}\n"
            "    errorfile 504 {{ config.error_file_path }}\n"
            "    {%- endif %}\n",
            _defaults(limits),
        ),
        (
            "    bind {{ config.frontend_host }}:{{ config.frontend_port }}\n",
            "    bind {{ config.frontend_host }}:{{ config.frontend_port }}\n" + _frontend(limits),
        ),
        (
            "    # Enable HTTP connection reuse for better performance\n",
            _backend(limits) + "    # Enable HTTP connection reuse for better performance\n",
        ),
        (
            "    server {{ server.name }} {{ server.host }}:{{ server.port }} check{% if",
            f"    server {{{{ server.name }}}} {{{{ server.host }}}}:{{{{ server.port }}}} check"
            f" maxconn {limits.max_in_flight}{{% if",
        ),
    ]


def haproxy_template(template: str, limits: Limits) -> str:
    """Serve's HAProxy configuration template with beamserve's part; ValueError where Serve's differs
    from the one this was written against (a Ray upgrade must be looked at, not silently pass)."""
    for old, new in _edits(limits):
        if template.count(old) != 1:
            raise ValueError(f"Serve's HAProxy template does not hold exactly one {old.strip()[:60]!r}")
        template = template.replace(old, new)
    return template


def install() -> None:
    """In every Ray worker: Serve's proxy answers in JSON (service/api/proxy_errors.py), and where Serve
    runs HAProxy, its configuration template gets beamserve's part."""
    from service.api import proxy_errors

    proxy_errors.install()
    if os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") != "1":
        return
    from ray.serve._private import haproxy

    if getattr(haproxy, "BEAMSERVE_TEMPLATE", False):
        return
    haproxy.HAPROXY_CONFIG_TEMPLATE = haproxy_template(haproxy.HAPROXY_CONFIG_TEMPLATE, limits_from_environment())  # type: ignore[attr-defined]
    haproxy.BEAMSERVE_TEMPLATE = True  # type: ignore[attr-defined]
