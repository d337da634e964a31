"""Translation memories (service/store/memories.py): made from a TMX file, read back as one, added to one
approved translation at a time, and named by a translation request (`"memory": {"id": ..., "min_match": ...}`)
so that the sentences they hold are answered from them. Each is owned by the key that made it.

No `from __future__ import annotations` (service/api/http.py says why).
"""

import asyncio
from typing import Any

from fastapi import Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from service.api.bodies import multipart_body, openapi_body, parse_json
from service.api.http import app
from service.api.route_base import RouteBase
from service.errors import ApiError
from service.schemas import DeepLError, ErrorResponse, errors
from service.store.memories import MAX_SEGMENT_CHARS
from service.text import tmx

MEMORY_ERRORS = errors(ErrorResponse, 400, 401, 403, 404, 413, 415, 422, 503)
TMX_TYPE = "application/x-tmx+xml"


class Unit(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: str = Field(min_length=1, max_length=MAX_SEGMENT_CHARS)
    target: str = Field(min_length=1, max_length=MAX_SEGMENT_CHARS)


class UnitsRequest(BaseModel):
    """Approved translations added to a memory (a source it holds takes the new target)."""

    model_config = ConfigDict(extra="forbid")
    units: list[Unit] = Field(min_length=1, max_length=1000)


class MemoryRoutes(RouteBase):
    @app.post(
        "/v1/memories",
        status_code=201,
        responses=MEMORY_ERRORS,
        openapi_extra=multipart_body(
            ["file", "name", "source_lang", "target_lang"],
            {
                "file": {"type": "string", "format": "binary", "description": "a TMX file"},
                "name": {"type": "string", "minLength": 1, "maxLength": 1024},
                "source_lang": {"type": "string", "examples": ["EN"]},
                "target_lang": {"type": "string", "examples": ["DE"]},
            },
        ),
    )
    async def create_memory(self, request: Request) -> JSONResponse:
        """A translation memory of a served pair made from a TMX file's units for it, owned by the calling key
        (the languages named as DeepL's glossary forms name them: source_lang, target_lang, any case)."""
        client = await self._client(request)
        upload, fields = await self._document_form(request, "a TMX file")
        missing = [f for f in ("name", "source_lang", "target_lang") if not fields.get(f)]
        if missing:
            raise ApiError("invalid_request", f"{', '.join(missing)}: required beside the file")
        source, target = self._pair(fields["source_lang"], fields["target_lang"])
        units = await asyncio.to_thread(tmx.read, await upload.read(), source, target)
        made = await self.memories.create(client.id, fields["name"], source, target, units)
        return JSONResponse(made.info(), status_code=201)

    @app.get("/v1/memories", responses=errors(ErrorResponse, 401, 403, 503))
    async def memories_listed(self, request: Request) -> dict[str, Any]:
        """The calling key's memories, oldest first: each one's id, name, pair, units and times."""
        return {"memories": await self.memories.listing((await self._client(request)).id)}

    @app.get("/v1/memories/{memory_id}", responses=errors(ErrorResponse, 401, 403, 404, 503))
    async def memory_info(self, memory_id: str, request: Request) -> dict[str, Any]:
        return (await self.memories.get(memory_id, (await self._client(request)).id)).info()

    @app.get(
        "/v1/memories/{memory_id}/tmx",
        responses={**errors(ErrorResponse, 401, 403, 404, 503), 200: {"content": {TMX_TYPE: {}}}},
    )
    async def memory_tmx(self, memory_id: str, request: Request) -> Response:
        """The memory's units as a TMX 1.4 file."""
        found = await self.memories.get(memory_id, (await self._client(request)).id)
        body = await asyncio.to_thread(tmx.write, found.units, found.source, found.target)
        disposition = f'attachment; filename="memory-{found.memory_id}.tmx"'
        return Response(body, media_type=TMX_TYPE, headers={"Content-Disposition": disposition})

    @app.post(
        "/v1/memories/{memory_id}/units",
        responses=MEMORY_ERRORS,
        openapi_extra=openapi_body(UnitsRequest, ("application/json",)),
    )
    async def memory_add(self, memory_id: str, request: Request) -> dict[str, Any]:
        """Approved translations added to the memory; answers its info."""
        client = await self._client(request)
        body = parse_json(UnitsRequest, await request.body())
        units = {" ".join(u.source.split()): " ".join(u.target.split()) for u in body.units}
        return (await self.memories.add(memory_id, client.id, units)).info()

    @app.delete("/v1/memories/{memory_id}", status_code=204, responses=errors(ErrorResponse, 401, 403, 404, 503))
    async def memory_delete(self, memory_id: str, request: Request) -> Response:
        await self.memories.delete(memory_id, (await self._client(request)).id)
        return Response(status_code=204)

    @app.get("/v3/translation_memories", responses=errors(DeepLError, 400, 403, 503))
    async def deepl_translation_memories(
        self,
        request: Request,
        page: int = Query(0, ge=0, description="DeepL's: 0-indexed"),
        page_size: int = Query(25, ge=1, le=25, description="DeepL's: at most 25"),
    ) -> dict[str, Any]:
        """DeepL-compatible (its clients' `list_translation_memories`): the calling key's memories, oldest first."""
        listed = await self.memories.listing((await self._client(request)).id)
        return {
            "translation_memories": [
                {
                    "translation_memory_id": m["memory_id"],
                    "name": m["name"],
                    "source_language": m["source"],
                    "target_languages": [m["target"]],
                    "segment_count": m["units"],
                }
                for m in listed[page * page_size : (page + 1) * page_size]
            ]
        }

    def _pair(self, source: str, target: str) -> tuple[str, str]:
        """A served pair's codes (ApiError unsupported_pair otherwise)."""
        source, target = self.router.pairs.code(source.strip().lower()), self.router.pairs.code(target.strip().lower())
        self.router.pairs.check(source, target)
        return source, target
