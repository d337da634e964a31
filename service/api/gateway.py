"""The HTTP ingress: beamserve's API, health and stats here, DeepL's and LibreTranslate's routes in
service/api/deepl_routes.py and service/api/libretranslate_routes.py (what they share: service/api/route_base.py).
Each route validates and answers; service/routing/pair_router.py does the translating.

No `from __future__ import annotations` (service/api/http.py says why).
"""

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from ray import serve

from service import local_ray, tracing
from service.api import api_docs, openapi, ui
from service.api.bodies import json_response, openapi_body, parse_json
from service.api.client_address import trusted_networks
from service.api.deepl_glossary_routes import DeepLGlossaryRoutes
from service.api.gateway_spread import gateways_and_hosts
from service.api.http import app
from service.api.keys import KeyLimits, Keys, load_keys
from service.api.libretranslate_routes import LibreTranslateRoutes
from service.api.memory_routes import MemoryRoutes
from service.api.route_base import TRANSLATE_ERRORS
from service.engine import allocator
from service.error_codes import RETRY_AFTER_S
from service.errors import ApiError, retry_after
from service.metrics import gateway_metrics
from service.registry import ModelEntry
from service.routing.document_jobs import DocumentJobs
from service.routing.local_handle import LocalHandle, PairHandle
from service.routing.pair_router import PairRouter
from service.schemas import (
    ErrorResponse,
    KeyUsage,
    Language,
    ModelInfo,
    ModelsResponse,
    Readiness,
    ScoreRequest,
    ScoreResponse,
    TranslateRequest,
    TranslateResponse,
    errors,
)
from service.settings import Settings
from service.store.glossaries import Glossaries
from service.store.memories import Memories
from service.store.records import open_records, storage_of, unshared
from service.text.languages import name as language_name


def held_here(entries: list[dict[str, Any]], settings: Settings) -> list[Any]:
    """The ServedModels of entries, loaded in this process; the import is here so that a gateway that
    holds no model imports no torch."""
    if not entries:
        return []
    from service.engine.served_model import ServedModel

    models = [ModelEntry.model_validate(x) for x in entries]
    # Engines in processes of their own load side by side (each replica's wait is for its host); engines in
    # this process load one after the other, as Translator.load wants.
    apart = all(settings.uses_engine_process(e) for e in models)
    with ThreadPoolExecutor(len(models) if apart else 1) as pool:
        return list(pool.map(lambda e: ServedModel(e, settings.for_entry(e)), models))


@serve.deployment(max_ongoing_requests=1024, max_queued_requests=512, ray_actor_options={"num_cpus": 0})
@serve.ingress(app)
class Gateway(DeepLGlossaryRoutes, LibreTranslateRoutes, MemoryRoutes):
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
        tracing.setup(self.settings, "gateway")
        self.local = held_here(local or [], self.settings)
        for model in self.local:
            pairs = {**pairs, **dict.fromkeys(model.entry.pairs, LocalHandle(model))}
        self.router = PairRouter(pairs, self.settings, pooled or {})
        limits = KeyLimits(
            self.settings.key_requests_per_minute,
            self.settings.key_characters_per_day,
            self.settings.key_characters_per_month,
        )
        storage = storage_of(self.settings.records_storage, self.settings.limits_storage)
        refused = unshared(storage, *gateways_and_hosts())
        if refused:
            raise ValueError(refused)
        self.records = open_records(storage)
        self.keys = Keys(
            load_keys(self.settings.api_keys, self.settings.api_keys_file, limits),
            self.settings.limits_storage,
            self.records if self.settings.api_keys_store else None,
            limits,
            KeyLimits(self.settings.address_requests_per_minute, self.settings.address_characters_per_day),
            trusted_networks(self.settings.trusted_proxies),
        )
        self.glossaries = Glossaries(self.records)
        self.memories = Memories(self.records, self.settings.memory_index_bytes, allocator.trimmed)
        self.documents = DocumentJobs(self.records, self.router, self._refund_owner, self._owner_job)
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

    async def drain(self) -> int:
        """Stop accepting translations (503, and /readyz 503) so a load balancer moves away; the ones
        accepted go on, and the running documents are handed over now (service/routing/document_jobs.py), as
        the replica's stop would after its drain: resumable from their last chunk saved, they are no reason to
        keep the server up. Returns how many translations are in flight."""
        self.draining = True
        await self._hand_documents_over()
        return self.in_flight

    def translations_in_flight(self) -> int:
        return self.in_flight

    async def __del__(self) -> None:
        """Serve stops the replica (scale-down, rollout, SIGTERM): its running documents are handed over to the
        replica that next reads their status (service/routing/document_jobs.py), none failed. (Serve's ingress
        wrapper awaits a destructor that is a coroutine function, and only such a one.)"""
        await self._hand_documents_over()
        await asyncio.to_thread(tracing.flush)  # the spans of its last requests

    async def _hand_documents_over(self) -> None:
        """The running documents handed over to the replica that next reads their status, none failed."""
        documents: DocumentJobs | None = self.__dict__.get("documents")  # None: __init__ refused to start
        if documents is not None:
            await documents.stop()

    @app.post(
        "/v1/translate",
        response_model=TranslateResponse,
        responses=TRANSLATE_ERRORS,
        openapi_extra=openapi_body(TranslateRequest, ("application/json",)),
    )
    async def translate(self, request: Request) -> Response:
        with self._accepting():
            client = await self._client(request)
            req = parse_json(TranslateRequest, await request.body())
            async with self._billed(client, sum(map(len, req.texts))) as bill:
                terms = await self._terms(req, client)
                routed = await self.router.translate(req, terms, recall=await self._recall(req, client))
                bill.refund_after = routed.echoed_characters
                return json_response(routed.response)

    @app.post(
        "/v1/score",
        response_model=ScoreResponse,
        responses=TRANSLATE_ERRORS,
        openapi_extra=openapi_body(ScoreRequest, ("application/json",)),
    )
    async def score(self, request: Request) -> Response:
        """Each translation's tokens scored by the pair's model (as CTranslate2's score_batch), billed as its text."""
        with self._accepting():
            client = await self._client(request)
            req = parse_json(ScoreRequest, await request.body())
            async with self._billed(client, sum(map(len, req.texts))):
                return json_response(await self.router.score(req))

    @app.get("/", include_in_schema=False)
    async def page(self) -> Response:
        """The translation page for people (service/api/ui/)."""
        return ui.response("index.html")

    @app.get("/ui/{name}", include_in_schema=False)
    async def page_file(self, name: str) -> Response:
        return ui.response(name)

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(self) -> Response:
        """The OpenAPI document in Swagger UI (service/api/api_docs.py)."""
        return api_docs.page()

    @app.get("/docs/assets/{name}", include_in_schema=False)
    async def docs_file(self, name: str) -> Response:
        return api_docs.asset(name)

    @app.get("/v1/usage", response_model=KeyUsage, responses=errors(ErrorResponse, 401, 403, 500, 503))
    async def usage(self, request: Request) -> KeyUsage:
        """The calling key's characters translated in its current day and 30-day windows, with its limits."""
        return await self.keys.usage(await self._client(request))

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
