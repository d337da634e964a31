"""The FastAPI application's HTTP plumbing: the body limit, request ids, request metrics, and every
error as JSON {"error": code, "detail": message, "request_id": id}.

No `from __future__ import annotations` in the modules that declare routes: Serve pickles the ingress
class, and FastAPI must see real types (Request, the pydantic models), not strings.
"""

import asyncio
import functools
import inspect
import json
import logging
import math
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from ray import serve
from ray.serve.exceptions import RayServeException
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route

from service import request_log, tracing
from service.api import deepl, front, libretranslate
from service.error_codes import RETRY_AFTER_S, status_of
from service.errors import ApiError, api_error, retry_after
from service.metrics import gateway_metrics
from service.settings import Settings

logger = logging.getLogger(__name__)
ENDPOINTS = {
    "/v1/translate",
    "/translate",
    "/detect",
    "/languages",
    "/frontend/settings",
    "/v2/translate",
    "/v2/languages",
    "/v2/usage",
    "/v1/usage",
    "/v1/models",
    "/v1/stats",
    "/healthz",
    "/readyz",
}

QUIET = {"/healthz", "/readyz"}  # probes: counted, not logged
# Routes the ingress calls on the Gateway itself, the hot ones that take a Request and return a Response.
DIRECT = {("POST", "/v1/translate"): "translate"}

app = FastAPI(
    title="beamserve",
    version="0.1.0",
    description="Machine translation with Marian-compatible Transformers, beam search and continuous batching.",
    # No redirect from a path with a slash added or removed: Starlette builds its Location from the request's
    # Host header, which a client sets to anything; such a path is a 404 like any other unknown one.
    redirect_slashes=False,
    # Swagger UI and ReDoc from this server's own files (service/api/api_docs.py), not FastAPI's CDN pages.
    docs_url=None,
    redoc_url=None,
    swagger_ui_oauth2_redirect_url=None,
)


@functools.cache
def _environment() -> Settings:
    """The settings of the environment, read the first time a request arrives before the Gateway exists
    (not at import: importing the app reads nothing)."""
    return Settings()


def replica_gateway() -> Any:
    """The Gateway of the ingress replica this runs in, once it is built (None before, and outside a
    replica). Serve copies the app into each replica by value, so a module global the Gateway set would
    not be the one the ingress reads."""
    try:
        owner = serve.get_replica_context().servable_object
    except RayServeException:
        return None
    return owner if getattr(owner, "settings", None) is not None else None


class _BodyTooLargeError(Exception):
    pass


def request_id(headers: Any) -> str:
    """The request's id: the client's X-Request-ID, or the one the front gave it (HAProxy and Serve's
    proxy both set the header), else a new one."""
    return str(headers.get("x-request-id") or uuid.uuid4().hex)


class Ingress:
    """The gateway's one pass over each HTTP request, around the FastAPI app: its id and summary line
    (service/request_log.py), the body limit (413 by Content-Length or while streaming; 408 for a body
    that stops arriving for body_timeout_s, so a slow client cannot hold a slot), CORS when cors_origins
    is set, and the request metrics (endpoint, pair, status, latency). Plain ASGI: no task or body copy
    per request."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.settings: Settings | None = None
        self.cors: Any = None  # Starlette's CORS middleware around `inner` while cors_origins is set
        self.whole_bodies = 0  # bodies up to this size arrive whole through the front (service/api/front.py)
        self.direct: dict[tuple[str, str], Any] = {}  # (method, path) -> the Gateway's route, called directly

    def _configured(self) -> Settings:
        """The replica's settings, read once the Gateway exists (the app is built before it)."""
        if self.settings is not None:
            return self.settings
        gateway = replica_gateway()
        if gateway is None:
            return _environment()
        found: Settings = gateway.settings
        self.settings = found
        self.direct = {route: getattr(gateway, name) for route, name in DIRECT.items()}
        self.whole_bodies = front.BUFFERED_BODY_BYTES if found.proxy == "haproxy" else 0
        if found.origins():
            self.cors = CORSMiddleware(
                self.inner,
                allow_origins=found.origins(),
                allow_methods=["GET", "POST"],
                allow_headers=["Authorization", "Content-Type", "X-Request-ID", "traceparent", "tracestate"],
                expose_headers=["X-Request-ID", "Retry-After", "Server-Timing", "traceresponse"],
                max_age=600,
            )
        return found

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.inner(scope, receive, send)
        if tracing.on():
            return await self._traced(scope, receive, send)
        return await self._serve(scope, receive, send)

    async def _traced(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """_serve in a server span continuing the client's trace context, named by the route's template once
        known (a path may hold an id), the trace's id answered in `traceresponse`."""
        method, path = scope["method"], scope["path"]
        attributes = {"http.request.method": method, "url.path": path}
        with tracing.continued(f"{method} {path}", tracing.http_headers(scope["headers"]), **attributes) as span:
            status = 0

            async def sent(message: dict[str, Any]) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                    traced = (b"traceresponse", tracing.traceresponse(span))
                    message = {**message, "headers": [*message.get("headers", []), traced]}
                await send(message)

            await self._serve(scope, receive, sent)
            # The route's template (a path may hold an id); a route called directly has its path.
            route = getattr(scope.get("route"), "path", None) or (path if path in ENDPOINTS else None)
            span.update_name(f"{method} {route or 'other'}")
            span.set_attribute("http.response.status_code", status)
            if route is not None:
                span.set_attribute("http.route", route)
            if status >= 500:
                from opentelemetry.trace import StatusCode

                span.set_status(StatusCode.ERROR)

    async def _serve(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        start = time.perf_counter()
        settings = self._configured()
        path: str = scope["path"]
        limit, wait = settings.max_body_bytes, settings.body_timeout_s
        if path in front.DOCUMENT_PATHS:
            limit = settings.max_document_bytes
        rid = None
        declared = b"0"  # no Content-Length and not chunked: no body (HTTP/1.1)
        encoding = b"identity"
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                rid = value.decode("latin-1")
            elif name == b"content-length" or name == b"transfer-encoding":
                declared = value  # a length, or "chunked": the body's size is unknown
            elif name == b"content-encoding":
                encoding = value.strip().lower()
        rid = rid or uuid.uuid4().hex
        if scope["method"] == "HEAD":  # a GET's answer without its body (RFC 9110), on every GET route
            scope, send = {**scope, "method": "GET"}, _headers_only(send)
        summary = request_log.start(rid, path, scope["method"])
        status = 0
        head: dict[str, Any] | None = None

        async def sent(message: dict[str, Any]) -> None:
            # The head goes out with the body's first part, one after the other: a replica that dies between
            # the two (Serve hands them across threads) would leave the front a head it cannot send again.
            nonlocal status, head
            if message["type"] == "http.response.start":
                status = message["status"]
                timing = server_timing(summary, time.perf_counter() - start)
                head = {**message, "headers": [*message.get("headers", []), (b"server-timing", timing)]}
                return
            if head is not None:
                message_head, head = head, None
                await send(message_head)
            await send(message)

        size = int(declared) if declared.isdigit() else None
        if size is not None and size > limit:
            await _reject(path, rid, sent, "body_too_large", f"request body over {limit} bytes")
        elif encoding != b"identity" and size != 0:
            coding = encoding.decode("latin-1")[:40]
            detail = f"Content-Encoding {coding} is not supported: send the body uncompressed"
            await _reject(path, rid, sent, "unsupported_media_type", detail)
        elif size is not None and size <= self.whole_bodies:
            # The front delivers a body this small whole (HAProxy buffers it, bounding its time), and
            # the server reads no more than its Content-Length: nothing left to guard.
            route = None if self.cors else self.direct.get((scope["method"], path))
            app = self.cors or self.inner
            await (app(scope, receive, sent) if route is None else _call(route, scope, receive, sent))
        else:
            await self._guarded(scope, receive, sent, path, rid, limit, wait)
        endpoint = path if path in ENDPOINTS else "other"
        # The route's template, not its path: a path may hold an id or a secret (a document's address).
        summary.route = getattr(scope.get("route"), "path", None) or summary.route
        seconds = time.perf_counter() - start
        gateway_metrics().observe(endpoint, summary.metric_pair, status, seconds)
        summary.status, summary.duration_s = status, seconds
        if endpoint not in QUIET:
            request_log.emit(summary)

    async def _guarded(
        self, scope: dict[str, Any], receive: Any, send: Any, path: str, rid: str, limit: int, wait: float
    ) -> None:
        """The app with the body counted against `limit` (413) and each part of it awaited at most
        `wait` seconds (408)."""
        seen = 0
        answered = False  # a 408 went out: the app's own answer is dropped

        async def limited() -> Any:
            nonlocal seen, answered
            try:
                async with asyncio.timeout(wait):
                    message = await receive()
            except TimeoutError:
                await _reject(path, rid, send, "body_timeout", f"no part of the request body came for {wait:.0f}s")
                answered = True
                return {"type": "http.disconnect"}  # the app stops reading and gives up
            seen += len(message.get("body", b""))
            if seen > limit:
                raise _BodyTooLargeError
            return message

        async def guarded(message: dict[str, Any]) -> None:
            if not answered:
                await send(message)

        try:
            await (self.cors or self.inner)(scope, limited, guarded)
        except _BodyTooLargeError:
            await _reject(path, rid, send, "body_too_large", f"request body over {limit} bytes")


def server_timing(summary: request_log.RequestSummary, seconds: float) -> bytes:
    """The Server-Timing header (W3C; a browser's developer tools show it): the longest any of the request's
    sentences waited to start decoding (`queue`), the longest a model call spent decoding (`decode`), and the
    gateway's time from the request to its answer (`total`), in milliseconds."""
    parts = (("queue", summary.queue_wait_s), ("decode", summary.decode_s), ("total", seconds))
    return ", ".join(f"{name};dur={1000 * s:.2f}" for name, s in parts).encode()


async def _call(route: Any, scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A route that takes the Request and returns a Response, called without FastAPI's routing and
    parameter machinery (a tenth of a cached request's CPU); its errors answered by the app's handlers,
    as through the app."""
    request = Request(scope, receive)
    try:
        response = await route(request)
    except Exception as exc:
        handler = next(
            (app.exception_handlers[k] for k in type(exc).__mro__ if k in app.exception_handlers),
            app.exception_handlers[Exception],
        )
        answer = handler(request, exc)
        response = await answer if inspect.isawaitable(answer) else answer
    await response(scope, receive, send)


def _headers_only(send: Any) -> Any:
    """send, with every body part emptied: the Content-Length stays the GET's, as HEAD's answer says."""

    async def headers_only(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            message = {**message, "body": b""}
        await send(message)

    return headers_only


async def _reject(path: str, rid: str, send: Any, code: str, detail: str) -> None:
    status, shaped = shape_error(path, status_of(code), {"error": code, "detail": detail})
    body = json.dumps({**shaped, "request_id": rid}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


app.add_middleware(Ingress)


def shape_error(path: str, status: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """An error as the clients of the route's API read it: DeepL's, LibreTranslate's, or beamserve's."""
    if path.startswith(deepl.PREFIXES):
        return deepl.error(status, body)
    return libretranslate.error(path, status, body)


class ErrorJSON(JSONResponse):
    """JSON whose strings may hold what the client sent that is not valid Unicode (a lone surrogate, which
    JSON's "\\ud800" reads as): written back as the same escape, where Starlette's UTF-8 encoding fails."""

    def render(self, content: Any) -> bytes:
        text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        return text.encode("utf-8", "backslashreplace")


def error_response(request: Request, body: dict[str, Any], headers: dict[str, str] | None = None) -> JSONResponse:
    """The error {"error": code, "detail": ...} with its code's status, in the shape of the route's API."""
    status = status_of(body["error"])
    if status in (503, 504) and not any(k.lower() == "retry-after" for k in headers or {}):
        headers = {**(headers or {}), **retry_after(RETRY_AFTER_S.get(str(body.get("error")), 1.0))}
    status, body = shape_error(request.url.path, status, body)
    return ErrorJSON({**body, "request_id": request_id(request.headers)}, status_code=status, headers=headers)


@app.exception_handler(ApiError)
async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    if exc.status >= 500:
        logger.warning(
            "%s %s -> %d %s: %s (request %s)",
            request.method,
            request.url.path,
            exc.status,
            exc.code,
            exc.detail,
            request_id(request.headers),
        )
    return error_response(request, exc.body(), exc.headers)


@app.exception_handler(RequestValidationError)
async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = [
        {"loc": list(e.get("loc", [])), "msg": e.get("msg", ""), **_as_sent(e.get("input"))} for e in exc.errors()
    ]
    if any(e.get("type") == "json_invalid" for e in exc.errors()):  # not JSON at all: malformed, not invalid
        return error_response(request, {"error": "invalid_json", "detail": errors})
    return error_response(request, {"error": "invalid_request", "detail": errors})


def _as_sent(value: object) -> dict[str, object]:
    """{"input": the value as the client sent it} for a scalar (a long string cut to its first 100
    characters, a non-finite number as text); nothing for a list or an object (a whole body, a text list)."""
    if isinstance(value, str):
        return {"input": value if len(value) <= 100 else value[:100] + "..."}
    if isinstance(value, float) and not math.isfinite(value):
        return {"input": str(value)}
    if value is None or isinstance(value, bool | int | float):
        return {"input": value}
    return {}


HTTP_CODES = {
    400: "malformed_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
    415: "unsupported_media_type",
}


@app.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """FastAPI's and Starlette's own errors (an unknown route, a body it cannot parse) in the same shape;
    a status without a code of its own answers as the closest code (malformed_request for a 4xx)."""
    code = HTTP_CODES.get(exc.status_code) or ("malformed_request" if exc.status_code < 500 else "internal_error")
    headers = dict(exc.headers or {})
    if exc.status_code == 405:  # every method of the path, not only those of the first route that matched it
        path = request.scope["path"]
        routes = [r for r in request.app.router.routes if isinstance(r, Route) and r.path_regex.match(path)]
        headers["Allow"] = ", ".join(sorted({m for r in routes for m in r.methods or ()}))
    return error_response(request, {"error": code, "detail": str(exc.detail)}, headers)


@app.exception_handler(RecursionError)
async def _too_deep(request: Request, exc: RecursionError) -> JSONResponse:
    """A JSON body nested deeper than the parser goes (100,000 brackets): the client's, not a bug."""
    return error_response(request, {"error": "invalid_json", "detail": "the JSON body is nested too deeply"})


@app.exception_handler(Exception)
async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    """A typed error (service/errors.py) raised here rather than in a replica gets its status; anything
    else is a bug, logged with its traceback and answered as JSON like every error."""
    known = api_error(exc)
    if known is not None:
        return error_response(request, known.body(), known.headers)
    rid = request_id(request.headers)
    logger.error("%s %s failed (request %s)", request.method, request.url.path, rid, exc_info=exc)
    return error_response(
        request, {"error": "internal_error", "detail": f"the server failed on this request ({type(exc).__name__})"}
    )
