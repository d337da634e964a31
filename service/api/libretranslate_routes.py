"""LibreTranslate's API (service/api/libretranslate.py reads its bodies): translation, detection, its web
client's settings, and files, each answered in LibreTranslate's shape.

No `from __future__ import annotations` (service/api/http.py says why).
"""

import asyncio
from typing import Any
from urllib.parse import quote

from fastapi import Request, Response

from service.api import libretranslate
from service.api.bodies import read_body
from service.api.client_address import reached_base
from service.api.http import app
from service.api.libretranslate import DETECT_OPENAPI, FILE_OPENAPI
from service.api.route_base import LIBRE_ERRORS, LIBRE_TRANSLATE_ERRORS, RouteBase, download
from service.errors import ApiError
from service.routing.sources import DETECT_CHARS
from service.schemas import ErrorResponse, errors
from service.text import documents


class LibreTranslateRoutes(RouteBase):
    @app.post(
        "/translate",
        response_model=libretranslate.LibreTranslateResponse,
        response_model_exclude_none=True,
        responses=LIBRE_TRANSLATE_ERRORS,
        openapi_extra=libretranslate.OPENAPI,
    )
    async def libretranslate(self, request: Request) -> dict[str, Any]:
        """LibreTranslate-compatible: JSON or form body with q (string or list), source, target, alternatives."""
        with self._accepting():
            return await self._libretranslate(request)

    async def _libretranslate(self, request: Request) -> dict[str, Any]:
        body = await read_body(request, libretranslate.form_field)
        client = await self._client(request, body.get("api_key"))
        texts, single = libretranslate.texts_of(body)
        async with self._billed(client, sum(map(len, texts))) as bill:
            req = libretranslate.request_of(body, self.settings.max_beam_size)
            routed = await self.router.translate(req, recall=await self._recall(req, client))
            bill.refund_after = routed.echoed_characters
        return libretranslate.response(single, libretranslate.alternatives(body), routed.response)

    @app.post("/detect", responses=LIBRE_ERRORS, openapi_extra=DETECT_OPENAPI)
    async def detect(self, request: Request) -> Any:
        """LibreTranslate-compatible: q (a string or a list) -> each text's candidate languages, most
        likely first, with confidence in percent."""
        body = await read_body(request, libretranslate.form_field)
        client = await self._client(request, body.get("api_key"))
        texts, single = libretranslate.texts_of(body)
        async with self._billed(client, 0):  # a request, no characters translated
            self.router.checks.count(texts)
            self.router.checks.texts(texts)  # what a translation would accept, though detection reads the heads
            heads = [t[:DETECT_CHARS] for t in texts]
            ranks = await asyncio.to_thread(lambda: [self.router.sources.detector.rank(t) for t in heads])
        out = [[libretranslate.detected_language(d) for d in r] for r in ranks]
        return out[0] if single else out

    @app.get("/frontend/settings")
    async def frontend_settings(self) -> dict[str, Any]:
        """What LibreTranslate's web client and apps read before they translate."""
        targets = sorted({pair.split("-")[1] for pair in self.router.pairs.direct})
        return libretranslate.frontend_settings(self.settings.max_text_chars, targets, keys=self.keys.enabled)

    @app.post("/translate_file", responses=LIBRE_ERRORS, openapi_extra=FILE_OPENAPI)
    async def libretranslate_file(self, request: Request) -> dict[str, str]:
        """LibreTranslate-compatible: a document translated, answered with the address of its translation
        (a secret address: the document's id and key)."""
        with self._accepting():
            upload, fields = await self._document_form(request)
            client = await self._client(request, fields.get("api_key"))
            filename = documents.safe_name(upload.filename or "")
            req = libretranslate.file_request(fields)
            limit = self.settings.request_timeout_s
            started = await self._start_document(client, request, upload, filename, req, wait_s=limit)
            doc, key = started["document_id"], started["document_key"]
            if (await self.documents.status(doc, key, client.id)).answer()["status"] not in ("done", "error"):
                await self.documents.cancel(doc)  # no address will be answered: stopped, and refunded
                if (await self.documents.status(doc, key, client.id)).answer()["status"] != "done":
                    raise ApiError("timeout", f"the document was not translated within {limit:.0f}s")
            await self.documents.result(doc, key, client.id)  # a failed document: its error, here
            # The address configured, else the one a trusted proxy says the client reached, else the server's own.
            peer = request.client.host if request.client else None
            reached = None if self.settings.public_url else reached_base(peer, request.headers, self.keys.trusted)
            base = reached or self.settings.link_base()
            return {"translatedFileUrl": f"{base}/download_file/{doc}-{key}/{quote(filename)}"}

    @app.get("/download_file/{handle}/{filename}", responses=errors(ErrorResponse, 404, 503))
    async def libretranslate_download(self, handle: str, filename: str) -> Response:
        """A translated document at the address /translate_file answered."""
        doc, _, key = handle.partition("-")
        return download(*await self.documents.result_by_key(doc, key))
