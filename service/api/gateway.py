"""The HTTP ingress: beamserve's API, LibreTranslate's and DeepL's, health and stats. Each route
validates and answers; service/routing/pair_router.py does the translating.

No `from __future__ import annotations` (service/api/http.py says why).
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from ray import serve
from starlette.datastructures import UploadFile

from service import local_ray, request_log
from service.api import deepl, libretranslate, openapi, ui
from service.api.bodies import json_response, openapi_body, parse_json, read_body
from service.api.http import app
from service.api.keys import Client, KeyLimits, Keys, load_keys
from service.api.libretranslate import DETECT_OPENAPI, FILE_OPENAPI
from service.engine import allocator
from service.error_codes import RETRY_AFTER_S
from service.errors import ApiError, retry_after
from service.metrics import gateway_metrics
from service.registry import ModelEntry
from service.routing.document_jobs import UPLOAD_WAIT_S, DocumentJobs, DocumentStatus
from service.routing.local_handle import LocalHandle, PairHandle
from service.routing.pair_router import PairRouter
from service.routing.sources import DETECT_CHARS
from service.schemas import (
    BODY_ERRORS,
    DeepLError,
    ErrorResponse,
    KeyUsage,
    Language,
    LibreError,
    ModelInfo,
    ModelsResponse,
    Readiness,
    TranslateRequest,
    TranslateResponse,
    errors,
)
from service.settings import Settings
from service.store.glossaries import Glossaries
from service.store.records import open_records, storage_of
from service.text import documents, glossary
from service.text.languages import name as language_name

ERRORS = errors(ErrorResponse, *BODY_ERRORS)
TRANSLATE_ERRORS = errors(ErrorResponse, *BODY_ERRORS, 404)  # 404: a glossary id the key does not own
LIBRE_ERRORS = errors(LibreError, *(s for s in BODY_ERRORS if s != 422))  # LibreTranslate has no 422
DEEPL_STATUSES = (400, 403, 408, 413, 415, 429, 456, 500, 503, 504)  # DeepL has no 401, 422
DEEPL_ERRORS = errors(DeepLError, *DEEPL_STATUSES)
DEEPL_TRANSLATE_ERRORS = errors(DeepLError, *DEEPL_STATUSES, 404)  # 404: a glossary id the key does not own


def _file(body: bytes, status: DocumentStatus) -> Response:
    """A translated document as a download under its own name."""
    disposition = f"attachment; filename*=UTF-8''{quote(status.filename)}"
    return Response(body, media_type=status.content_type, headers={"Content-Disposition": disposition})


def held_here(entries: list[dict[str, Any]], settings: Settings) -> list[Any]:
    """The ServedModels of entries, loaded in this process; the import is here so that a gateway that
    holds no model imports no torch."""
    if not entries:
        return []
    from service.engine.served_model import ServedModel

    return [ServedModel(e, settings.for_entry(e)) for e in (ModelEntry.model_validate(x) for x in entries)]


@dataclass
class Bill:
    """A request's charge: its client, and the characters given back once it is answered."""

    client: Client
    refund_after: int = 0


@serve.deployment(max_ongoing_requests=1024, max_queued_requests=512, ray_actor_options={"num_cpus": 0})
@serve.ingress(app)
class Gateway:
    """HTTP ingress: the routes, their keys and limits, draining; its PairRouter translates (by source and
    target, on the pair's deployment or a model this process holds)."""

    def __init__(
        self,
        pairs: dict[str, PairHandle],
        settings: dict[str, Any],
        pooled: dict[str, str] | None = None,
        local: list[dict[str, Any]] | None = None,
    ) -> None:
        """pairs: each pair's deployment; pooled: the pairs of the model pool, and their model's name;
        local: registry entries this process loads and serves itself (Settings.colocate)."""
        local_ray.pin_replica_grpc()
        self.settings = Settings(**settings)
        self.local = held_here(local or [], self.settings)
        for model in self.local:
            pairs = {**pairs, **dict.fromkeys(model.entry.pairs, LocalHandle(model))}
        self.router = PairRouter(pairs, self.settings, pooled or {})
        limits = KeyLimits(
            self.settings.key_requests_per_minute,
            self.settings.key_characters_per_day,
            self.settings.key_characters_per_month,
        )
        self.keys = Keys(
            load_keys(self.settings.api_keys, self.settings.api_keys_file, limits), self.settings.limits_storage
        )
        self.records = open_records(storage_of(self.settings.records_storage, self.settings.limits_storage))
        self.glossaries = Glossaries(self.records)
        self.documents = DocumentJobs(self.records, self.router, self._refund_owner)
        gateway_metrics()
        app.openapi = openapi.served(app, self.settings, self.router.pairs.languages)  # type: ignore[method-assign]
        self.draining = False  # set by drain(): new translations are refused, accepted ones finish
        self.in_flight = 0  # translation requests accepted and not yet answered

    def check_health(self) -> None:
        """Serve's health check: a model held here whose engine died or wedged fails it (the replica is
        replaced), as a model replica's would."""
        for model in self.local:
            if (problem := model.health()) is not None:
                raise RuntimeError(problem)

    def reconfigure(self, config: dict[str, Any]) -> None:
        """Serve's user_config, set while models are held here: their batching knobs, applied live."""
        for model in self.local:
            model.reconfigure(config)

    def drain(self) -> int:
        """Stop accepting translations (503, and /readyz 503) so a load balancer moves away; the ones
        accepted go on. Returns how many are in flight."""
        self.draining = True
        return self.in_flight

    def translations_in_flight(self) -> int:
        return self.in_flight

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

    def _client(self, request: Request, body_key: object = None) -> Client:
        """The request's client, ApiError 401/403 while keys are on: asked before a body is validated, so
        a client without a valid key learns nothing of what the body would have needed."""
        if body_key is not None and not isinstance(body_key, str):
            raise ApiError("invalid_request", "api_key must be a string")
        client = self.keys.client(request.headers, body_key)
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

    async def _terms(self, req: TranslateRequest, client: Client) -> glossary.Terms | None:
        """The request's glossary, ready to apply: checked against its pair and its owner."""
        if req.glossary is None:
            return None
        assert req.source is not None  # TranslateRequest: a glossary needs the source named
        return await self.glossaries.terms(req.glossary, req.source, req.target, client.id)

    @app.post(
        "/v1/translate",
        response_model=TranslateResponse,
        responses=TRANSLATE_ERRORS,
        openapi_extra=openapi_body(TranslateRequest, ("application/json",)),
    )
    async def translate(self, request: Request) -> Response:
        with self._accepting():
            client = self._client(request)
            req = parse_json(TranslateRequest, await request.body())
            async with self._billed(client, sum(map(len, req.texts))) as bill:
                terms = await self._terms(req, client)
                routed = await self.router.translate(req, terms)
                bill.refund_after = routed.echoed_characters
                return json_response(routed.response)

    @app.post(
        "/translate",
        response_model=libretranslate.LibreTranslateResponse,
        response_model_exclude_none=True,
        responses=LIBRE_ERRORS,
        openapi_extra=libretranslate.OPENAPI,
    )
    async def libretranslate(self, request: Request) -> dict[str, Any]:
        """LibreTranslate-compatible: JSON or form body with q (string or list), source, target, alternatives."""
        with self._accepting():
            return await self._libretranslate(request)

    async def _libretranslate(self, request: Request) -> dict[str, Any]:
        body = await read_body(request, libretranslate.form_field)
        client = self._client(request, body.get("api_key"))
        texts, single = libretranslate.texts_of(body)
        async with self._billed(client, sum(map(len, texts))) as bill:
            req = libretranslate.request_of(body, self.settings.max_beam_size)
            routed = await self.router.translate(req)
            bill.refund_after = routed.echoed_characters
        return libretranslate.response(single, libretranslate.alternatives(body), routed.response)

    @app.post("/detect", responses=LIBRE_ERRORS, openapi_extra=DETECT_OPENAPI)
    async def detect(self, request: Request) -> Any:
        """LibreTranslate-compatible: q (a string or a list) -> each text's candidate languages, most
        likely first, with confidence in percent."""
        body = await read_body(request, libretranslate.form_field)
        client = self._client(request, body.get("api_key"))
        texts, single = libretranslate.texts_of(body)
        async with self._billed(client, 0):  # a request, no characters translated
            self.router.checks.count(texts)
            self.router.checks.texts(texts)  # what a translation would accept, though detection reads the heads
            heads = [t[:DETECT_CHARS] for t in texts]
            ranks = await asyncio.to_thread(lambda: [self.router.sources.detector.rank(t) for t in heads])
        out = [[libretranslate.detected_language(d) for d in r] for r in ranks]
        return out[0] if single else out

    @app.get("/", include_in_schema=False)
    async def page(self) -> Response:
        """The translation page for people (service/api/ui/)."""
        return ui.response("index.html")

    @app.get("/ui/{name}", include_in_schema=False)
    async def page_file(self, name: str) -> Response:
        return ui.response(name)

    @app.get("/frontend/settings")
    async def frontend_settings(self) -> dict[str, Any]:
        """What LibreTranslate's web client and apps read before they translate."""
        targets = sorted({pair.split("-")[1] for pair in self.router.pairs.direct})
        return libretranslate.frontend_settings(self.settings.max_text_chars, targets, keys=self.keys.enabled)

    @app.post(
        "/v2/translate",
        response_model=deepl.DeepLTranslateResponse,
        responses=DEEPL_TRANSLATE_ERRORS,
        openapi_extra=deepl.OPENAPI,
    )
    async def deepl_translate(self, request: Request) -> deepl.DeepLTranslateResponse:
        """DeepL-compatible (service/api/deepl.py): text list, target_lang, optional source_lang."""
        with self._accepting():
            client = self._client(request)
            _, req = deepl.parse(await read_body(request, deepl.form_field))
            async with self._billed(client, sum(map(len, req.texts))) as bill:
                terms = await self._terms(req, client)
                routed = await self.router.translate(req, terms)
                bill.refund_after = routed.echoed_characters
            return deepl.response(req, routed.response)

    @app.post("/v2/glossaries", status_code=201, responses=DEEPL_ERRORS, openapi_extra=deepl.GLOSSARY_OPENAPI)
    async def deepl_create_glossary(self, request: Request) -> JSONResponse:
        """DeepL-compatible: a glossary from tsv or csv entries, for a served pair, owned by the calling key."""
        client = self._client(request)
        async with self._billed(client, 0):
            body = deepl.glossary_request(await read_body(request, deepl.form_field))
            source, target = deepl.code_of(body.source_lang), deepl.code_of(body.target_lang)
            self.router.pairs.check(source, target)  # a glossary is for a pair served
            entries = glossary.parse_entries(body.entries, body.entries_format)
            made = await self.glossaries.create(glossary.new_glossary(body.name, source, target, entries, client.id))
        return JSONResponse(made.info(), status_code=201)

    async def _document_form(self, request: Request) -> tuple[UploadFile, dict[str, str]]:
        """A document upload's file and its other fields (multipart/form-data)."""
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise ApiError("unsupported_media_type", "a document is uploaded as multipart/form-data with a file")
        form = await request.form()
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise ApiError("invalid_request", "file: a document to translate is required")
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
        answering once it is done or after wait_s."""
        parsed = await asyncio.to_thread(allocator.released, documents.parse, filename, await upload.read())
        if req.source is None:  # the whole document in the language of its beginning
            heads = [" ".join(parsed.segments)[:DETECT_CHARS] or "-"]
            found = self.router.sources.detector.detect(heads, markup=parsed.html)[0]
            req = req.model_copy(update={"source": found.language})
        self.router.pairs.check(req.source or "", req.target)
        if parsed.html:
            req = req.model_copy(update={"tag_handling": "html"})
        async with self._billed(client, parsed.characters):
            terms = await self._terms(req, client)

            async def refund() -> None:
                await self.keys.refund(client, parsed.characters)

            return await self.documents.upload(parsed, filename, req, terms, client.id, refund, wait_s)

    @app.post("/v2/document", responses=DEEPL_TRANSLATE_ERRORS, openapi_extra=deepl.DOCUMENT_OPENAPI)
    async def deepl_document(self, request: Request) -> dict[str, str]:
        """DeepL-compatible: a document (multipart `file`) to translate in the background; its id and key."""
        with self._accepting():
            client = self._client(request)
            upload, fields = await self._document_form(request)
            filename = fields.get("filename") or upload.filename or ""
            req = deepl.document_request(fields, filename)
            return await self._start_document(client, request, upload, filename, req)

    @app.post("/translate_file", responses=LIBRE_ERRORS, openapi_extra=FILE_OPENAPI)
    async def libretranslate_file(self, request: Request) -> dict[str, str]:
        """LibreTranslate-compatible: a document translated, answered with the address of its translation
        (a secret address: the document's id and key)."""
        with self._accepting():
            upload, fields = await self._document_form(request)
            client = self._client(request, fields.get("api_key"))
            filename = upload.filename or ""
            req = libretranslate.file_request(fields)
            limit = self.settings.request_timeout_s
            started = await self._start_document(client, request, upload, filename, req, wait_s=limit)
            doc, key = started["document_id"], started["document_key"]
            if (await self.documents.status(doc, key, client.id)).answer()["status"] not in ("done", "error"):
                await self.documents.cancel(doc)  # no address will be answered: stopped, and refunded
                if (await self.documents.status(doc, key, client.id)).answer()["status"] != "done":
                    raise ApiError("timeout", f"the document was not translated within {limit:.0f}s")
            await self.documents.result(doc, key, client.id)  # a failed document: its error, here
            base = str(request.base_url).rstrip("/")
            return {"translatedFileUrl": f"{base}/download_file/{doc}-{key}/{quote(filename)}"}

    @app.get("/download_file/{handle}/{filename}", responses=errors(ErrorResponse, 404, 503))
    async def libretranslate_download(self, handle: str, filename: str) -> Response:
        """A translated document at the address /translate_file answered."""
        doc, _, key = handle.partition("-")
        return _file(*await self.documents.result_by_key(doc, key))

    @app.post("/v2/document/{document_id}", responses=errors(DeepLError, 400, 403, 404, 503))
    async def deepl_document_status(self, document_id: str, request: Request) -> dict[str, Any]:
        """DeepL-compatible: the document's status, seconds_remaining while translating, billed_characters once done."""
        client = self._client(request)
        key = str((await read_body(request, deepl.form_field)).get("document_key", ""))
        return (await self.documents.status(document_id, key, client.id)).answer()

    @app.post("/v2/document/{document_id}/result", responses=errors(DeepLError, 400, 403, 404, 503))
    async def deepl_document_result(self, document_id: str, request: Request) -> Response:
        """DeepL-compatible: the translated document, once done (503 before)."""
        client = self._client(request)
        key = str((await read_body(request, deepl.form_field)).get("document_key", ""))
        return _file(*await self.documents.result(document_id, key, client.id))

    @app.get("/v2/glossaries", responses=errors(DeepLError, 403, 503))
    async def deepl_glossaries(self, request: Request) -> dict[str, Any]:
        """DeepL-compatible: the calling key's glossaries, oldest first."""
        owned = await self.glossaries.owned(self._client(request).id)
        return {"glossaries": [g.info() for g in owned]}

    @app.get("/v2/glossaries/{glossary_id}", responses=errors(DeepLError, 403, 404, 503))
    async def deepl_glossary(self, glossary_id: str, request: Request) -> dict[str, Any]:
        return (await self.glossaries.get(glossary_id, self._client(request).id)).info()

    @app.get("/v2/glossaries/{glossary_id}/entries", responses=errors(DeepLError, 403, 404, 415, 503))
    async def deepl_glossary_entries(self, glossary_id: str, request: Request) -> Response:
        """The entries as tab-separated values, the one format DeepL answers them in."""
        accept = request.headers.get("accept", "*/*")
        if not any(t in accept for t in ("text/tab-separated-values", "*/*", "text/*")):
            raise ApiError("unsupported_media_type", "the entries are answered as text/tab-separated-values")
        found = await self.glossaries.get(glossary_id, self._client(request).id)
        return Response(found.tsv(), media_type="text/tab-separated-values; charset=utf-8")

    @app.delete("/v2/glossaries/{glossary_id}", status_code=204, responses=errors(DeepLError, 403, 404, 503))
    async def deepl_delete_glossary(self, glossary_id: str, request: Request) -> Response:
        await self.glossaries.delete(glossary_id, self._client(request).id)
        return Response(status_code=204)

    @app.get("/v2/glossary-language-pairs")
    async def deepl_glossary_pairs(self) -> dict[str, list[dict[str, str]]]:
        return deepl.glossary_pairs(self.router.pairs.everything())

    @app.get("/v2/usage", response_model=deepl.DeepLUsage, responses=errors(DeepLError, 403, 500, 503))
    async def deepl_usage(self, request: Request) -> deepl.DeepLUsage:
        """DeepL-compatible: the key's characters in its current 30-day window, and its limit."""
        used = await self.keys.usage(self.keys.client(request.headers))
        limit = used.characters_month_limit or deepl.UNLIMITED
        return deepl.DeepLUsage(character_count=used.characters_month, character_limit=limit)

    @app.get("/v1/usage", response_model=KeyUsage, responses=errors(ErrorResponse, 401, 403, 500, 503))
    async def usage(self, request: Request) -> KeyUsage:
        """The calling key's characters translated in its current day and 30-day windows, with its limits."""
        return await self.keys.usage(self.keys.client(request.headers))

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

    @app.get("/languages", response_model=list[Language])
    async def languages(self) -> list[Language]:
        targets: dict[str, list[str]] = {}
        for pair in self.router.pairs.everything():
            src, tgt = pair.split("-")
            targets.setdefault(src, []).append(tgt)
            targets.setdefault(tgt, [])
        return [Language(code=c, name=language_name(c), targets=t) for c, t in sorted(targets.items())]

    @app.get("/v1/models", response_model=ModelsResponse)
    async def models(self) -> ModelsResponse:
        infos = await self.router.infos()
        return ModelsResponse(models=[ModelInfo(**{k: i.get(k) for k in ModelInfo.model_fields}) for i in infos])

    @app.get("/v1/stats")
    async def stats(self) -> dict[str, Any]:
        """Per pair: queue depth, active sentences, batches and their sizes (for operators and tests), and
        this gateway replica's work in flight and refusals on the pair's behalf."""
        out = {i["name"]: i for i in await self.router.infos()}
        for pair, a in self.router.decoder.admission.items():
            if pair in out:
                hits, misses = self.router.decoder.cache.lookups(pair)
                out[pair]["gateway"] = {
                    "in_flight_work": a.in_flight,
                    "refused": a.refused_here,
                    "cache_hits": hits,
                    "cache_misses": misses,
                    "cache": self.router.decoder.cache.summary(),  # the gateway's one cache, all pairs
                }
        return out

    @app.get("/healthz")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", responses={**errors(ErrorResponse, 404), 503: {"model": Readiness}})
    async def readyz(self, pair: str | None = None) -> JSONResponse:
        """200 while this gateway takes traffic: not draining, and some pair's model answers (a pair that
        is down answers its own requests 503). With ?pair=en-de, that pair's readiness. Never waits on a
        replica: it reads PairHealth, refreshed in the background (service/routing/pair_health.py)."""
        if self.draining:
            return JSONResponse(
                {"status": "draining"}, status_code=503, headers=retry_after(RETRY_AFTER_S["shutting_down"])
            )
        if pair is not None and pair not in self.router.pairs.direct:
            raise ApiError("unknown_pair", f"no model for {pair}; {self.router.pairs.listed()}")
        health = self.router.health
        infos = await health.current()
        pairs = {p: "ready" if health.ready(p) else "unavailable" for p in self.router.pairs.direct}
        ready = health.ready(pair) if pair is not None else any(health.ready(p) for p in self.router.pairs.direct)
        status = "ready" if ready else ("starting" if not infos else "not ready")
        retry = None if ready else {"Retry-After": "2"}
        return JSONResponse({"status": status, "pairs": pairs}, status_code=200 if ready else 503, headers=retry)
