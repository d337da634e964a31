"""What every route of the ingress reads (its settings, router, keys, stores, whether it drains) and the
steps routes share: taking a request in, the client's key, billing, a glossary's terms, a document's
upload. The routes are in service/api/gateway.py (beamserve's own, health and stats),
service/api/deepl_routes.py and service/api/libretranslate_routes.py; Gateway is all three.

No `from __future__ import annotations` (service/api/http.py says why).
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from urllib.parse import quote

from fastapi import Request, Response
from starlette.datastructures import UploadFile

from service import request_log
from service.api.bodies import form_of
from service.api.keys import Client, Keys
from service.engine import allocator
from service.error_codes import RETRY_AFTER_S
from service.errors import ApiError, retry_after
from service.routing.document_jobs import UPLOAD_WAIT_S, DocumentJobs, DocumentStatus, Job
from service.routing.pair_router import PairRouter
from service.routing.sources import DETECT_CHARS
from service.schemas import BODY_ERRORS, DeepLError, ErrorResponse, LibreError, TranslateRequest, errors
from service.settings import Settings
from service.store.glossaries import Glossaries
from service.store.memories import Memories
from service.store.records import Records
from service.text import documents, glossary
from service.text.memory import Recall

ERRORS = errors(ErrorResponse, *BODY_ERRORS)
TRANSLATE_ERRORS = errors(ErrorResponse, *BODY_ERRORS, 404)  # 404: a glossary id the key does not own
LIBRE_ERRORS = errors(LibreError, *(s for s in BODY_ERRORS if s != 422))  # LibreTranslate has no 422
LIBRE_TRANSLATE_ERRORS = errors(LibreError, *(s for s in BODY_ERRORS if s != 422), 404)  # 404: a memory not its key's
DEEPL_STATUSES = (400, 403, 408, 413, 415, 429, 456, 500, 503, 504)  # DeepL has no 401, 422
DEEPL_ERRORS = errors(DeepLError, *DEEPL_STATUSES)
DEEPL_TRANSLATE_ERRORS = errors(DeepLError, *DEEPL_STATUSES, 404)  # 404: a glossary id the key does not own


def download(body: bytes, status: DocumentStatus) -> Response:
    """A translated document as a download under its own name."""
    disposition = f"attachment; filename*=UTF-8''{quote(status.filename)}"
    return Response(body, media_type=status.content_type, headers={"Content-Disposition": disposition})


@dataclass
class Bill:
    """A request's charge: its client, and the characters given back once it is answered."""

    client: Client
    refund_after: int = 0


class RouteBase:
    """The ingress's state (set by Gateway.__init__) and the steps its routes share."""

    settings: Settings
    router: PairRouter
    keys: Keys
    records: Records
    glossaries: Glossaries
    memories: Memories
    documents: DocumentJobs
    draining: bool  # set by drain(): new translations are refused, accepted ones finish
    in_flight: int  # translation requests accepted and not yet answered

    @contextlib.contextmanager
    def _accepting(self) -> Iterator[None]:
        if self.draining:
            raise ApiError("shutting_down", "the server is shutting down", retry_after(RETRY_AFTER_S["shutting_down"]))
        if self.in_flight >= self.settings.max_in_flight:  # the cheapest refusal: before any model work
            raise ApiError(
                "overloaded",
                f"{self.in_flight} requests in flight on this gateway",
                retry_after(RETRY_AFTER_S["overloaded"]),
            )
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    async def _client(self, request: Request, body_key: object = None) -> Client:
        """The request's client, ApiError 401/403 while keys are on: asked before a body is validated, so
        a client without a valid key learns nothing of what the body would have needed."""
        if body_key is not None and not isinstance(body_key, str):
            raise ApiError("invalid_request", "api_key must be a string")
        client = await self.keys.client(request.headers, body_key, request.client.host if request.client else None)
        request_log.current().client = client.id
        return client

    @contextlib.asynccontextmanager
    async def _billed(self, client: Client, characters: int) -> AsyncIterator[Bill]:
        """client charged one request and its characters (ApiError 429 past its limits); a request that
        fails is refunded its characters, one answered is refunded the bill's refund_after (the characters
        of its texts that came back as they were: already in the target language)."""
        await self.keys.charge(client, characters)
        bill = Bill(client)
        try:
            yield bill
        except BaseException:
            await self.keys.refund(client, characters)
            raise
        if bill.refund_after:
            await self.keys.refund(client, bill.refund_after)

    async def _refund_owner(self, owner: str, characters: int) -> None:
        """Give back characters charged to the client named `owner` (a document settled as failed)."""
        await self.keys.refund(self.keys.client_of(owner), characters)

    async def _owner_job(self, req: TranslateRequest, owner: str) -> Job:
        """_job for the client named `owner` (a document another replica took over)."""
        return await self._job(req, self.keys.client_of(owner))

    async def _job(self, req: TranslateRequest, client: Client) -> Job:
        """A document's request with its glossary and memory as `client` has them."""
        return Job(req, await self._terms(req, client), await self._recall(req, client))

    async def _terms(self, req: TranslateRequest, client: Client) -> glossary.Terms | None:
        """The request's glossary, ready to apply: checked against its pair and its owner."""
        if req.glossary is None:
            return None
        assert req.source is not None  # TranslateRequest: a glossary needs the source named
        return await self.glossaries.terms(req.glossary, req.source, req.target, client.id)

    async def _recall(self, req: TranslateRequest, client: Client) -> Recall | None:
        """The request's translation memory, ready to look sentences up in: checked against its pair and owner."""
        asked = req.recall()
        if asked is None:
            return None
        assert req.source is not None  # TranslateRequest: a memory needs the source named
        source, target = self.router.pairs.code(req.source), self.router.pairs.code(req.target)
        return Recall(await self.memories.index(asked.id, client.id, source, target), asked.min_match)

    async def _document_form(
        self, request: Request, what: str = "a document to translate"
    ) -> tuple[UploadFile, dict[str, str]]:
        """An upload's file (`what` it must be) and its other fields (multipart/form-data)."""
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise ApiError("unsupported_media_type", f"{what} is uploaded as multipart/form-data with a file")
        form = await form_of(request)
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise ApiError("invalid_request", f"file: {what} is required")
        return upload, {k: str(v) for k, v in form.items() if k != "file"}

    async def _start_document(
        self,
        client: Client,
        request: Request,
        upload: UploadFile,
        filename: str,
        req: TranslateRequest,
        wait_s: float = UPLOAD_WAIT_S,
    ) -> dict[str, str]:
        """Parse a document, bill its characters and start its translation (service/routing/document_jobs.py),
        answering once it is done or after wait_s. `filename`: the routes' documents.safe_name of the upload's."""
        self.documents.queue.room_for(client.id)  # before the work of parsing it
        data = await upload.read()
        parsed = await asyncio.to_thread(allocator.released, documents.parse, filename, data)
        if req.source is None:  # the whole document in the language of its beginning
            heads = [" ".join(parsed.segments)[:DETECT_CHARS] or "-"]
            found = self.router.sources.detector.detect(heads, markup=parsed.html)[0]
            req = req.model_copy(update={"source": found.language})
        self.router.pairs.check(req.source or "", req.target)
        if parsed.html:
            req = req.model_copy(update={"tag_handling": "html"})
        async with self._billed(client, parsed.characters):
            job = await self._job(req, client)

            async def refund() -> None:
                await self.keys.refund(client, parsed.characters)

            return await self.documents.upload(parsed, data, filename, job, client.id, refund, wait_s)
