"""The errors a request can end in, and the JSON body they are answered with: ApiError (a code of
service/error_codes.py, each with its one HTTP status, and a message), CodedError (a typed error of a
layer below the routes that names its code), and the model's and Ray's own errors mapped to codes.

A leaf: nothing here imports the rest of the service, so every layer raises these; Ray is imported only
when a raised error is looked up, so the engine and the text parsers run without it (the GPU stage)."""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable
from typing import Any, ClassVar, TypeVar

from model.errors import InputTooLongError, InvalidTextError
from service.error_codes import CODES, RETRY_AFTER_S, status_of


class CodedError(Exception):
    """An error of the engine, the text parsers or the stores that a client gets as its `code`; where it
    knows when to retry (an overload's estimate), its retry_after_s says so."""

    code: ClassVar[str]
    retry_after_s: float | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__ and cls.code not in CODES:
            raise TypeError(f"{cls.__name__}.code {cls.code!r} is not an error code")


@functools.cache
def types() -> dict[type[Exception], str]:
    """The errors of the model and of Ray, which cannot name a code themselves -> their code."""
    from ray.exceptions import ActorUnavailableError, RayActorError
    from ray.serve.exceptions import BackPressureError

    return {
        InputTooLongError: "input_too_long",
        InvalidTextError: "invalid_text",
        BackPressureError: "overloaded",  # Serve's queue ahead of a replica (max_queued_requests) is full
        # The pair's replica died or restarts mid-request: Serve replaces it within seconds.
        RayActorError: "replica_unavailable",
        ActorUnavailableError: "replica_unavailable",
    }


def message(body: dict[str, Any]) -> str:
    """An error body's detail as one string for a person: a validation error's list of {loc, msg}
    joined as "field.sub: why; ...", any other detail as it is."""
    detail = body.get("detail", body.get("error", ""))
    if isinstance(detail, str):
        return detail
    parts = []
    for e in detail:
        where, why = ".".join(map(str, e.get("loc", []))), str(e.get("msg", "")).removeprefix("Value error, ")
        parts.append(f"{where}: {why}" if where else why)  # a check of the whole body has no field
    return "; ".join(parts)


class ApiError(Exception):
    """An error answered with its code's status and a JSON body {"error": code, "detail": message}."""

    def __init__(self, code: str, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail, self.headers = status_of(code), code, detail, headers or {}

    def __reduce__(self) -> tuple[type[ApiError], tuple[str, str, dict[str, str]]]:
        return type(self), (self.code, self.detail, self.headers)

    def body(self) -> dict[str, str]:
        return {"error": self.code, "detail": self.detail}


def api_error(exc: BaseException) -> ApiError | None:
    """The answer to a typed error raised in a replica or here (Ray hands a replica's error over as a
    RayTaskError whose `cause` is the original); None for an error no client should see as such."""
    cause = getattr(exc, "cause", None) or exc
    if isinstance(cause, ApiError):
        return cause
    code = (
        cause.code
        if isinstance(cause, CodedError)
        else next((c for k, c in types().items() if isinstance(cause, k)), None)
    )
    if code is None:
        return None
    retry = getattr(cause, "retry_after_s", None) or RETRY_AFTER_S.get(code)
    return ApiError(code, str(cause), retry_after(retry) if retry is not None else None)


def retry_after(seconds: float) -> dict[str, str]:
    """The Retry-After header for a wait of `seconds`: whole seconds, at least one."""
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


T = TypeVar("T")


async def returned(call: Awaitable[T]) -> T | ApiError:
    """A replica's call with its typed errors (a text the model cannot take, a full queue, a deadline)
    returned as their ApiError, not raised: Serve logs a raised error at ERROR with its traceback, and
    these are answers to the client, not faults. The gateway raises them again (routing/pair_client.py)."""
    try:
        return await call
    except Exception as exc:
        known = api_error(exc)
        if known is None:
            raise
        return known
