"""DeepL's API (service/api/deepl.py reads its bodies): translation, glossaries, documents, usage and
languages, each answered in DeepL's shape.

No `from __future__ import annotations` (service/api/http.py says why).
"""

from typing import Any

from fastapi import Query, Request, Response
from fastapi.responses import JSONResponse

from service.api import deepl
from service.api.bodies import read_body
from service.api.http import app
from service.api.route_base import DEEPL_ERRORS, DEEPL_TRANSLATE_ERRORS, RouteBase, download
from service.errors import ApiError
from service.schemas import DeepLError, errors
from service.text import documents, glossary
from service.text.glossary import MAX_GLOSSARIES

# Query parameters, the same on every route that takes them; a Query object each, as FastAPI binds one to one
# parameter.


def page_offset() -> Any:
    """A glossary listing's `offset` (beamserve's; DeepL's listings are whole)."""
    return Query(0, ge=0, description="beamserve's: glossaries skipped, oldest first")


def page_limit() -> Any:
    """A glossary listing's `limit` (beamserve's)."""
    return Query(MAX_GLOSSARIES, ge=1, le=MAX_GLOSSARIES, description="beamserve's: at most this many")


def lang() -> Any:
    """A language query parameter."""
    return Query(min_length=2, max_length=16, examples=["EN"])


class DeepLRoutes(RouteBase):
    @app.post(
        "/v2/translate",
        response_model=deepl.DeepLTranslateResponse,
        responses=DEEPL_TRANSLATE_ERRORS,
        openapi_extra=deepl.OPENAPI,
    )
    async def deepl_translate(self, request: Request) -> deepl.DeepLTranslateResponse:
        """DeepL-compatible (service/api/deepl.py): text list, target_lang, optional source_lang."""
        with self._accepting():
            client = await self._client(request)
            _, req = deepl.parse(await read_body(request, deepl.form_field))
            async with self._billed(client, sum(map(len, req.texts))) as bill:
                terms = await self._terms(req, client)
                routed = await self.router.translate(req, terms, recall=await self._recall(req, client))
                bill.refund_after = routed.echoed_characters
            return deepl.response(req, routed.response)

    @app.post("/v2/glossaries", status_code=201, responses=DEEPL_ERRORS, openapi_extra=deepl.GLOSSARY_OPENAPI)
    async def deepl_create_glossary(self, request: Request) -> JSONResponse:
        """DeepL-compatible: a glossary from tsv or csv entries, for a served pair, owned by the calling key."""
        client = await self._client(request)
        async with self._billed(client, 0):
            body = deepl.body_of(deepl.DeepLGlossaryRequest, await read_body(request, deepl.form_field))
            pair, entries = self._dictionary(body)
            made = await self.glossaries.create(glossary.new_glossary(body.name, {pair: entries}, client.id))
        return JSONResponse(glossary.v2_info(made.info()), status_code=201)

    @app.post("/v2/document", responses=DEEPL_TRANSLATE_ERRORS, openapi_extra=deepl.DOCUMENT_OPENAPI)
    async def deepl_document(self, request: Request) -> dict[str, str]:
        """DeepL-compatible: a document (multipart `file`) to translate in the background; its id and key."""
        with self._accepting():
            client = await self._client(request)
            upload, fields = await self._document_form(request)
            filename = documents.safe_name(fields.get("filename") or upload.filename or "")
            req = deepl.document_request(fields, filename)
            return await self._start_document(client, request, upload, filename, req)

    @app.post("/v2/document/{document_id}", responses=errors(DeepLError, 400, 403, 404, 503))
    async def deepl_document_status(self, document_id: str, request: Request) -> dict[str, Any]:
        """DeepL-compatible: the document's status, queue_position once it waits in its place (beamserve's),
        seconds_remaining while translating, billed_characters once done."""
        client = await self._client(request)
        key = str((await read_body(request, deepl.form_field)).get("document_key", ""))
        return (await self.documents.status(document_id, key, client.id)).answer()

    @app.post("/v2/document/{document_id}/result", responses=errors(DeepLError, 400, 403, 404, 503))
    async def deepl_document_result(self, document_id: str, request: Request) -> Response:
        """DeepL-compatible: the translated document, once done (503 before)."""
        client = await self._client(request)
        key = str((await read_body(request, deepl.form_field)).get("document_key", ""))
        return download(*await self.documents.result(document_id, key, client.id))

    @app.get("/v2/glossaries", responses=errors(DeepLError, 400, 403, 503))
    async def deepl_glossaries(
        self,
        request: Request,
        offset: int = page_offset(),
        limit: int = page_limit(),
    ) -> dict[str, Any]:
        """DeepL-compatible: the calling key's glossaries, oldest first (all of them, as DeepL's clients
        expect; `offset` and `limit` page them)."""
        client = await self._client(request)
        listed = [g for g in map(glossary.v2_info, await self.glossaries.listing(client.id)) if g]
        return {"glossaries": listed[offset : offset + limit]}  # a glossary of several pairs is v3's alone

    @app.get("/v2/glossaries/{glossary_id}", responses=errors(DeepLError, 400, 403, 404, 503))
    async def deepl_glossary(self, glossary_id: str, request: Request) -> dict[str, Any]:
        return self._v2_info(await self.glossaries.get(glossary_id, (await self._client(request)).id))

    @app.get("/v2/glossaries/{glossary_id}/entries", responses=errors(DeepLError, 400, 403, 404, 415, 503))
    async def deepl_glossary_entries(self, glossary_id: str, request: Request) -> Response:
        """The entries as tab-separated values, the one format DeepL answers them in."""
        accept = request.headers.get("accept", "*/*")
        if not any(t in accept for t in ("text/tab-separated-values", "*/*", "text/*")):
            raise ApiError("unsupported_media_type", "the entries are answered as text/tab-separated-values")
        found = await self.glossaries.get(glossary_id, (await self._client(request)).id)
        self._v2_info(found)
        (entries,) = found.dictionaries.values()
        return Response(glossary.tsv(entries), media_type="text/tab-separated-values; charset=utf-8")

    @app.delete("/v2/glossaries/{glossary_id}", status_code=204, responses=errors(DeepLError, 403, 404, 503))
    async def deepl_delete_glossary(self, glossary_id: str, request: Request) -> Response:
        await self.glossaries.delete(glossary_id, (await self._client(request)).id)
        return Response(status_code=204)

    def _dictionary(self, body: deepl.DeepLGlossaryRequest | deepl.DeepLDictionary) -> tuple[str, dict[str, str]]:
        """A dictionary's pair (served codes) and entries; ApiError for a pair not served or entries that do not
        read."""
        source = self.router.pairs.code(deepl.code_of(body.source_lang))
        target = self.router.pairs.code(deepl.code_of(body.target_lang))
        self.router.pairs.check(source, target)  # a glossary is for a pair served
        return f"{source}-{target}", glossary.parse_entries(body.entries, body.entries_format)

    @staticmethod
    def _v2_info(found: glossary.Glossary) -> dict[str, Any]:
        info = glossary.v2_info(found.info())
        if info is None:
            raise ApiError(
                "invalid_glossary",
                f"glossary {found.glossary_id} holds {len(found.dictionaries)} dictionaries: "
                f"read it at /v3/glossaries/{found.glossary_id}",
            )
        return info

    @app.get("/v2/glossary-language-pairs")
    async def deepl_glossary_pairs(self) -> dict[str, list[dict[str, str]]]:
        return deepl.glossary_pairs(self.router.pairs.everything())

    @app.get("/v2/usage", response_model=deepl.DeepLUsage, responses=errors(DeepLError, 403, 500, 503))
    async def deepl_usage(self, request: Request) -> deepl.DeepLUsage:
        """DeepL-compatible: the key's characters in its current 30-day window, and its limit."""
        used = await self.keys.usage(await self._client(request))
        limit = used.characters_month_limit or deepl.UNLIMITED
        return deepl.DeepLUsage(character_count=used.characters_month, character_limit=limit)

    @app.get(
        "/v2/languages",
        response_model=list[deepl.DeepLLanguage],
        responses=errors(DeepLError, 400),
        openapi_extra={"parameters": [{"name": "type", "in": "query", "schema": {"enum": ["source", "target"]}}]},
    )
    async def deepl_languages(self, request: Request) -> list[deepl.DeepLLanguage]:
        """type=source|target, in the query or (as DeepL's clients send it) a form body of the GET."""
        kind = request.query_params.get("type")
        if kind is None:  # absent: source, as DeepL answers
            kind = str((await request.form()).get("type", "source"))
        return deepl.languages(self.router.pairs.everything(), kind)
