"""Serve's HTTP proxy answers in beamserve's JSON error shape where it would answer plain text.

Ray Serve (2.60) maps every exception of a proxied call it does not know to a bare plain-text 500.
When the gateway replica dies (killed, out of memory, its node lost), the requests in flight on it
were not answered and are safe to send again (a translation has no side effect): the honest answer
is 503 with Retry-After, in the same JSON shape as every other beamserve error, while Serve starts a
new replica. The proxy's own refusal when the gateway's queue is full (`max_queued_requests`,
BackPressureError) becomes the same JSON 503 `overloaded` as the gateway's.

`install()` runs in every Ray worker of `beamserve serve` (ray.init's worker_process_setup_hook), so
the proxy actor picks it up before it imports its module.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from service.error_codes import RETRY_AFTER_S, status_of


def install() -> None:
    from ray.exceptions import ActorUnavailableError, RayActorError
    from ray.serve._private import http_util
    from ray.serve._private.proxy_request_response import ResponseStatus
    from ray.serve.exceptions import BackPressureError

    original: Callable[[BaseException, float | None, str], Any] = http_util.get_http_response_status
    if getattr(original, "beamserve", False):
        return

    def status(exc: BaseException, request_timeout_s: float | None, request_id: str) -> Any:
        if isinstance(exc, BackPressureError):
            code, detail, retry = "overloaded", str(exc), exc.retry_after_s or 1
        elif isinstance(exc, RayActorError | ActorUnavailableError):
            code, detail, retry = (
                "replica_unavailable",
                "the ingress replica stopped while answering",
                RETRY_AFTER_S["replica_unavailable"],
            )
        else:
            return original(exc, request_timeout_s, request_id)
        return ResponseStatus(
            code=status_of(code),
            is_error=True,
            # A dict: the proxy sends it as application/json (http_util.convert_object_to_asgi_messages).
            message={"error": code, "detail": detail, "request_id": request_id},  # type: ignore[arg-type]
            headers=[*(http_util.retry_after_headers(retry) or []), (b"x-request-id", request_id.encode())],
        )

    status.beamserve = True  # type: ignore[attr-defined]
    http_util.get_http_response_status = status
    proxy = sys.modules.get("ray.serve._private.proxy")
    if proxy is not None:  # imported already: it bound the name at import
        proxy.get_http_response_status = status  # type: ignore[attr-defined]
