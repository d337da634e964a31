"""The FastAPI application's HTTP plumbing: the body limit, request metrics, and errors as JSON.

No `from __future__ import annotations` in the modules that declare routes: Serve pickles the ingress
class, and FastAPI must see real types (Request, the pydantic models), not strings.
"""

import json
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from service.errors import ApiError
from service.metrics import gateway_metrics
from service.settings import BODY_LIMIT

ENDPOINTS = {"/v1/translate", "/translate", "/languages", "/v1/models", "/v1/stats", "/healthz", "/readyz"}

app = FastAPI(
    title="beamserve", version="0.1.0",
    description="Machine translation with Marian-compatible Transformers, beam search and continuous batching.",
)


class _BodyTooLargeError(Exception):
    pass


class BodyLimit:
    """413 for bodies over the limit in force (settings.BODY_LIMIT), by Content-Length or while streaming."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.inner(scope, receive, send)
        limit = BODY_LIMIT["bytes"]
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await self._reject(send, limit)
        seen = 0

        async def limited() -> Any:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                raise _BodyTooLargeError
            return message

        try:
            await self.inner(scope, limited, send)
        except _BodyTooLargeError:
            await self._reject(send, limit)

    @staticmethod
    async def _reject(send: Any, limit: int) -> None:
        body = json.dumps({"error": "body_too_large", "detail": f"request body over {limit} bytes"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


app.add_middleware(BodyLimit)


@app.middleware("http")
async def _record(request: Request, call_next: Any) -> Any:
    """Count every request by endpoint, pair and status, with its latency (bounded label values only)."""
    start = time.perf_counter()
    response = await call_next(request)
    endpoint = request.url.path if request.url.path in ENDPOINTS else "other"
    pair = getattr(request.state, "pair", "")
    gateway_metrics().observe(endpoint, pair, response.status_code, time.perf_counter() - start)
    return response


@app.exception_handler(ApiError)
async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


@app.exception_handler(RequestValidationError)
async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = [{"loc": list(e.get("loc", [])), "msg": e.get("msg", "")} for e in exc.errors()]
    return JSONResponse({"error": "invalid_request", "detail": errors}, status_code=422)
