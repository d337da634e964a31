"""DeepL's v3 glossaries (multilingual: each glossary a set of dictionaries, one per language pair and direction),
which DeepL recommends for all glossary work, served as its clients call them (`deepl`'s
`create_multilingual_glossary` and the rest). A glossary made through v2 is one dictionary here; one of several
dictionaries is v3's alone. Translations on any route use the dictionary of their pair.

No `from __future__ import annotations` (service/api/http.py says why).
"""

from dataclasses import replace
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse

from service.api import deepl
from service.api.bodies import read_body
from service.api.deepl_routes import DeepLRoutes, lang, page_limit, page_offset
from service.api.http import app
from service.api.route_base import DEEPL_ERRORS
from service.errors import ApiError
from service.schemas import DeepLError, errors
from service.text import glossary


class DeepLGlossaryRoutes(DeepLRoutes):
    @app.post("/v3/glossaries", status_code=201, responses=DEEPL_ERRORS, openapi_extra=deepl.GLOSSARY_V3_OPENAPI)
    async def deepl_create_glossary_v3(self, request: Request) -> JSONResponse:
        """DeepL-compatible: a glossary of dictionaries, each for a served pair, owned by the calling key."""
        client = await self._client(request)
        async with self._billed(client, 0):
            body = deepl.body_of(deepl.DeepLGlossaryV3Request, await read_body(request, deepl.form_field))
            dictionaries = dict(map(self._dictionary, body.dictionaries))
            made = await self.glossaries.create(glossary.new_glossary(body.name, dictionaries, client.id))
        return JSONResponse(made.info(), status_code=201)

    @app.get("/v3/glossaries", responses=errors(DeepLError, 400, 403, 503))
    async def deepl_glossaries_v3(
        self,
        request: Request,
        offset: int = page_offset(),
        limit: int = page_limit(),
    ) -> dict[str, Any]:
        """DeepL-compatible: the calling key's glossaries, oldest first, each with its dictionaries' pairs and sizes."""
        listed = await self.glossaries.listing((await self._client(request)).id)
        return {"glossaries": listed[offset : offset + limit]}

    @app.get("/v3/glossaries/{glossary_id}", responses=errors(DeepLError, 403, 404, 503))
    async def deepl_glossary_v3(self, glossary_id: str, request: Request) -> dict[str, Any]:
        return (await self.glossaries.get(glossary_id, (await self._client(request)).id)).info()

    @app.patch(
        "/v3/glossaries/{glossary_id}",
        responses=errors(DeepLError, 400, 403, 404, 503),
        openapi_extra=deepl.GLOSSARY_PATCH_OPENAPI,
    )
    async def deepl_edit_glossary(self, glossary_id: str, request: Request) -> dict[str, Any]:
        """DeepL-compatible: a new name, and each dictionary given merged into the glossary's (its entries replacing
        those of the same source term, the rest kept; a new pair's added)."""
        client = await self._client(request)
        body = deepl.body_of(deepl.DeepLGlossaryPatch, await read_body(request, deepl.form_field))
        found = await self.glossaries.get(glossary_id, client.id)
        dictionaries = dict(found.dictionaries)
        for pair, entries in map(self._dictionary, body.dictionaries or []):
            dictionaries[pair] = {**dictionaries.get(pair, {}), **entries}
        name = glossary.checked_name(body.name) if body.name is not None else found.name
        changed = replace(found, name=name, dictionaries=glossary.checked_dictionaries(dictionaries))
        return (await self.glossaries.update(changed)).info()

    @app.delete("/v3/glossaries/{glossary_id}", status_code=204, responses=errors(DeepLError, 403, 404, 503))
    async def deepl_delete_glossary_v3(self, glossary_id: str, request: Request) -> Response:
        await self.glossaries.delete(glossary_id, (await self._client(request)).id)
        return Response(status_code=204)

    @app.get("/v3/glossaries/{glossary_id}/entries", responses=errors(DeepLError, 400, 403, 404, 503))
    async def deepl_glossary_entries_v3(
        self, glossary_id: str, request: Request, source_lang: str = lang(), target_lang: str = lang()
    ) -> dict[str, Any]:
        """DeepL-compatible: one dictionary's entries, as tab-separated values."""
        found, pair = await self._pair_of(glossary_id, request, source_lang, target_lang)
        source, target = pair.split("-")
        tsv = glossary.tsv(found.dictionaries[pair])
        one = {"source_lang": source, "target_lang": target, "entries": tsv, "entries_format": "tsv"}
        return {"dictionaries": [one]}

    @app.put(
        "/v3/glossaries/{glossary_id}/dictionaries",
        responses=errors(DeepLError, 400, 403, 404, 503),
        openapi_extra=deepl.DICTIONARY_OPENAPI,
    )
    async def deepl_replace_dictionary(self, glossary_id: str, request: Request) -> dict[str, Any]:
        """DeepL-compatible: a pair's dictionary replaced by the entries given (added where the glossary has none)."""
        client = await self._client(request)
        body = deepl.body_of(deepl.DeepLDictionary, await read_body(request, deepl.form_field))
        found = await self.glossaries.get(glossary_id, client.id)
        pair, entries = self._dictionary(body)
        dictionaries = glossary.checked_dictionaries({**found.dictionaries, pair: entries})
        await self.glossaries.update(replace(found, dictionaries=dictionaries))
        source, target = pair.split("-")
        return {"source_lang": source, "target_lang": target, "entry_count": len(dictionaries[pair])}

    @app.delete(
        "/v3/glossaries/{glossary_id}/dictionaries", status_code=204, responses=errors(DeepLError, 400, 403, 404, 503)
    )
    async def deepl_delete_dictionary(
        self, glossary_id: str, request: Request, source_lang: str = lang(), target_lang: str = lang()
    ) -> Response:
        """DeepL-compatible: a pair's dictionary removed; a glossary keeps at least one (delete the glossary)."""
        found, pair = await self._pair_of(glossary_id, request, source_lang, target_lang)
        left = {p: entries for p, entries in found.dictionaries.items() if p != pair}
        if not left:
            raise ApiError("invalid_glossary", f"{pair} is the glossary's one dictionary: delete the glossary instead")
        await self.glossaries.update(replace(found, dictionaries=left))
        return Response(status_code=204)

    async def _pair_of(
        self, glossary_id: str, request: Request, source_lang: str, target_lang: str
    ) -> tuple[glossary.Glossary, str]:
        """The caller's glossary and the pair named, which it has a dictionary for (else 404)."""
        found = await self.glossaries.get(glossary_id, (await self._client(request)).id)
        source = self.router.pairs.code(deepl.code_of(source_lang))
        target = self.router.pairs.code(deepl.code_of(target_lang))
        if found.dictionary(source, target) is None:
            raise ApiError("glossary_not_found", f"glossary {glossary_id} has no dictionary for {source} -> {target}")
        return found, f"{source}-{target}"
