"""The OpenAPI document's page for people: Swagger UI at `/docs`, its script and style served by this
server from the fastapi-offline package (no CDN: a browser without the internet, or behind a proxy that
blocks one, still shows it), under a policy that allows this server's resources alone. No ReDoc: its
bundle fetches its logo from its maker's CDN."""

from __future__ import annotations

import importlib.resources
from functools import cache

from fastapi import Response

from service.api import ui
from service.errors import ApiError

# The page's files: the package's Swagger UI bundle, and the script that starts it (no inline script).
VENDOR = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css", "favicon.png": "image/png"}
START = b"""window.ui = SwaggerUIBundle({
  url: "openapi.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
});
"""
START_NAME = "swagger-start.js"
# Swagger UI's stylesheet draws its icons from data: URIs.
POLICY = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
ASSET_CACHE = "public, max-age=86400"  # the files change only with the installed package

# Relative links, so that the page works under whatever path prefix a proxy mounts the server.
PAGE = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>beamserve API</title>
<link rel="stylesheet" href="docs/assets/swagger-ui.css">
<link rel="icon" href="docs/assets/favicon.png">
</head>
<body>
<div id="swagger-ui"></div>
<script src="docs/assets/swagger-ui-bundle.js"></script>
<script src="docs/assets/{START_NAME}"></script>
</body>
</html>
"""


def page() -> Response:
    return Response(
        PAGE,
        media_type="text/html; charset=utf-8",
        headers={**ui.SECURITY, "Content-Security-Policy": POLICY, "Cache-Control": "no-cache"},
    )


def asset(name: str) -> Response:
    """A file the page loads; ApiError not_found for any other name."""
    kind = "text/javascript" if name == START_NAME else VENDOR.get(name)
    if kind is None:
        raise ApiError("not_found", f"no file {name!r} in the API page's files")
    media = kind if kind.startswith("image/") else f"{kind}; charset=utf-8"
    return Response(_read(name), media_type=media, headers={**ui.SECURITY, "Cache-Control": ASSET_CACHE})


@cache
def _read(name: str) -> bytes:
    if name == START_NAME:
        return START
    return importlib.resources.files("fastapi_offline").joinpath("static", name).read_bytes()
