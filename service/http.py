"""The FastAPI application's HTTP plumbing: the body limit, request ids, request metrics, and every
error as JSON {"error": code, "detail": message, "request_id": id}.

No `from __future__ import annotations` in the modules that declare routes: Serve pickles the ingress
class, and FastAPI must see real types (Request, the pydantic models), not strings.
"""

import asyncio
import json
import logging
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

from service import deepl, libretranslate, request_log
from service.errors import ApiError, api_error
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

app = FastAPI(
    title="beamserve",
    version="0.1.0",
    description="Machine translation with Marian-compatible Transformers, beam search and continuous batching.",
)


_ENVIRONMENT = Settings()


def replica_settings() -> Settings:
    """The Settings of the ingress replica this runs in, for the middlewares (which run outside the
    Gateway's methods). Serve copies the app into each replica by value, so a module global the Gateway
    set would not be the one a middleware reads; outside a replica, the environment's Settings."""
    try:
        owner = serve.get_replica_context().servable_object
    except RayServeException:
        return _ENVIRONMENT
    settings: Settings | None = getattr(owner, "settings", None)  # None while the Gateway is being built
    return settings or _ENVIRONMENT


class _BodyTooLargeError(Exception):
    pass


class BodyLimit:
    """413 for bodies over max_body_bytes, by Content-Length or while streaming; 408 for a body that
    stops arriving for body_timeout_s (a slow client would otherwise hold
    one of the gateway's ongoing-request slots for as long as it likes)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.inner(scope, receive, send)
        settings = replica_settings()
        limit, wait = settings.max_body_bytes, settings.body_timeout_s
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await self._reject(scope, send, 413, "body_too_large", f"request body over {limit} bytes")
        seen = 0
        answered = False  # a 408 went out: the app's own answer is dropped

        async def limited() -> Any:
            nonlocal seen, answered
            try:
                message = await asyncio.wait_for(receive(), wait)
            except TimeoutError:
                await self._reject(
                    scope, send, 408, "body_timeout", f"no part of the request body came for {wait:.0f}s"
                )
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
            await self.inner(scope, limited, guarded)
        except _BodyTooLargeError:
            await self._reject(scope, send, 413, "body_too_large", f"request body over {limit} bytes")

    @staticmethod
    async def _reject(scope: dict[str, Any], send: Any, status: int, code: str, detail: str) -> None:
        rid = request_id({k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]})
        status, shaped = shape_error(scope.get("path", ""), status, {"error": code, "detail": detail})
        body = json.dumps({**shaped, "request_id": rid}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


app.add_middleware(BodyLimit)


class Cors:
    """Starlette's CORS middleware over the replica's allow-list (cors_origins), or nothing while it is
    empty: no CORS headers, and browsers refuse cross-origin calls."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.origins: list[str] = []
        self.cors: Any = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        origins = replica_settings().origins()
        if scope["type"] != "http" or not origins:
            return await self.inner(scope, receive, send)
        if self.cors is None or self.origins != origins:
            self.origins = origins
            self.cors = CORSMiddleware(
                self.inner,
                allow_origins=self.origins,
                allow_methods=["GET", "POST"],
                allow_headers=["Authorization", "Content-Type", "X-Request-ID"],
                expose_headers=["X-Request-ID", "Retry-After"],
                max_age=600,
            )
        await self.cors(scope, receive, send)


app.add_middleware(Cors)  # the outermost: a preflight is answered before any other work


def request_id(headers: Any) -> str:
    """The request's id. Serve's proxy puts one in every request (the client's X-Request-ID, else a new
    one) and returns it in the response's X-Request-ID header; outside Serve, a new one."""
    return str(headers.get("x-request-id") or uuid.uuid4().hex)


@app.middleware("http")
async def _record(request: Request, call_next: Any) -> Any:
    """Count every request by endpoint, pair and status, with its latency (bounded label values only),
    and log its summary line (service/request_log.py)."""
    start = time.perf_counter()
    summary = request_log.start(request_id(request.headers), request.url.path, request.method)
    response = await call_next(request)
    endpoint = request.url.path if request.url.path in ENDPOINTS else "other"
    pair = getattr(request.state, "pair", "")
    seconds = time.perf_counter() - start
    gateway_metrics().observe(endpoint, pair, response.status_code, seconds)
    summary.status, summary.duration_s = response.status_code, seconds
    if endpoint not in QUIET:
        request_log.emit(summary)
    return response


def shape_error(path: str, status: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """An error as the clients of the route's API read it: DeepL's, LibreTranslate's, or beamserve's."""
    if path.startswith(deepl.PREFIX):
        return deepl.error(status, body)
    return libretranslate.error(path, status, body)


def error_response(
    request: Request, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> JSONResponse:
    status, body = shape_error(request.url.path, status, body)
    return JSONResponse({**body, "request_id": request_id(request.headers)}, status_code=status, headers=headers)


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
    return error_response(request, exc.status, exc.body(), exc.headers)


@app.exception_handler(RequestValidationError)
async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = [{"loc": list(e.get("loc", [])), "msg": e.get("msg", "")} for e in exc.errors()]
    return error_response(request, 422, {"error": "invalid_request", "detail": errors})


HTTP_CODES = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}


@app.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """FastAPI's and Starlette's own errors (an unknown route, a body it cannot parse) in the same shape."""
    code = HTTP_CODES.get(exc.status_code, "http_error")
    return error_response(request, exc.status_code, {"error": code, "detail": str(exc.detail)}, dict(exc.headers or {}))


@app.exception_handler(RecursionError)
async def _too_deep(request: Request, exc: RecursionError) -> JSONResponse:
    """A JSON body nested deeper than the parser goes (100,000 brackets): the client's, not a bug."""
    return error_response(request, 422, {"error": "invalid_json", "detail": "the JSON body is nested too deeply"})


@app.exception_handler(Exception)
async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    """A typed error (service/errors.py) raised here rather than in a replica gets its status; anything
    else is a bug, logged with its traceback and answered as JSON like every error."""
    known = api_error(exc)
    if known is not None:
        return error_response(request, known.status, known.body(), known.headers)
    rid = request_id(request.headers)
    logger.error("%s %s failed (request %s)", request.method, request.url.path, rid, exc_info=exc)
    return error_response(
        request, 500, {"error": "internal_error", "detail": f"the server failed on this request ({type(exc).__name__})"}
    )
