"""Serve's HTTP proxy answers a request whose ingress replica died with a JSON 503 and Retry-After.

Ray Serve (2.60) maps every exception of a proxied call it does not know to a bare plain-text 500.
When the gateway replica dies (killed, out of memory, its node lost), the requests in flight on it
were not answered and are safe to send again (a translation has no side effect): the honest answer
is 503 with Retry-After, in the same JSON shape as every other beamserve error, while Serve starts a
new replica. `install()` runs in every Ray worker of `beamserve serve` (ray.init's
worker_process_setup_hook), so the proxy actor picks it up before it imports its module.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

RETRY_AFTER_S = 2  # Serve replaces a dead replica in about this long on one node


def install() -> None:
    from ray.exceptions import ActorUnavailableError, RayActorError
    from ray.serve._private import http_util
    from ray.serve._private.proxy_request_response import ResponseStatus

    original: Callable[[BaseException, float | None, str], Any] = http_util.get_http_response_status
    if getattr(original, "beamserve", False):
        return

    def status(exc: BaseException, request_timeout_s: float | None, request_id: str) -> Any:
        if not isinstance(exc, RayActorError | ActorUnavailableError):
            return original(exc, request_timeout_s, request_id)
        return ResponseStatus(
            code=503,
            is_error=True,
            # A dict: the proxy sends it as application/json (http_util.convert_object_to_asgi_messages).
            message={  # type: ignore[arg-type]
                "error": "replica_unavailable",
                "detail": "the ingress replica stopped while answering; retry",
                "request_id": request_id,
            },
            headers=[*(http_util.retry_after_headers(RETRY_AFTER_S) or []), (b"x-request-id", request_id.encode())],
        )

    status.beamserve = True  # type: ignore[attr-defined]
    http_util.get_http_response_status = status
    proxy = sys.modules.get("ray.serve._private.proxy")
    if proxy is not None:  # imported already: it bound the name at import
        proxy.get_http_response_status = status  # type: ignore[attr-defined]
