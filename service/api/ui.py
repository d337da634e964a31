"""The translation page at `/` (service/api/ui/: one HTML file, its script, its style and its icon, shipped
with the package): served as they are, with headers that keep the page to this server's own resources. The
page names them and the API relative to itself, so it works under a reverse proxy's path prefix."""

from __future__ import annotations

from pathlib import Path

from fastapi import Response

from service.errors import ApiError

FILES = {"index.html": "text/html", "app.js": "text/javascript", "style.css": "text/css", "icon.svg": "image/svg+xml"}
# Scripts and styles from this server alone, no frames, no guessing of types: the page shows what the
# API answers as text, and a policy keeps it that way should a text ever reach markup.
SECURITY = {  # on every page and file the server answers for people (the API's page too: service/api/api_docs.py)
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers without CSP level 2
    "Referrer-Policy": "no-referrer",  # a text typed into the page never leaves in a Referer
}
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    **SECURITY,
    "Cache-Control": "no-cache",
}
_read: dict[str, bytes] = {}


def response(name: str) -> Response:
    """The file `name` of service/api/ui/; ApiError not_found for any other name."""
    if name not in FILES:
        raise ApiError("not_found", f"no file {name!r} in the page's files")
    if name not in _read:
        _read[name] = (Path(__file__).parent / "ui" / name).read_bytes()
    return Response(_read[name], media_type=f"{FILES[name]}; charset=utf-8", headers=HEADERS)
