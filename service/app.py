"""FastAPI routes and the Ray Serve application: one ingress, one model deployment per language pair.

One deployment per pair (not model multiplexing): each pair is always loaded (the models are small),
scales on its own load with its own autoscaling config, and a pair's replicas never evict each
other's weights, which multiplexing's per-replica LRU would do under mixed traffic.

No `from __future__ import annotations` here: Serve pickles the ingress class, and FastAPI must see
real types (Request, the pydantic models), not strings it can no longer resolve.
"""

import asyncio
import json
import math
import re
import time
from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from ray import serve
from ray.serve.handle import DeploymentHandle

from model.translator import (
    DecodeOptions,
    InputTooLongError,
    InvalidTextError,
    Translator,
    check_text,
    resolve_model_path,
)
from service import local_ray
from service.engine import BatchingConfig, DeadlineExceededError, Engine, QueueFullError, RequestTooLargeError
from service.html_text import HtmlDocument, join_aligned
from service.metrics import ModelMetrics, gateway_metrics
from service.scheduler import batching_knobs, sized_for
from service.schemas import (
    ErrorResponse,
    Language,
    ModelInfo,
    ModelsResponse,
    TranslateRequest,
    TranslateResponse,
    Translation,
    Usage,
)
from service.sentences import join_translations, ranked, split_sentences
from service.settings import BODY_LIMIT, Settings

LANGUAGES = {"en": "English", "de": "German", "fr": "French", "es": "Spanish", "it": "Italian", "cs": "Czech"}
WARMUP = "A man in a blue shirt is standing on a ladder."
# Alignment runs between decoder steps; 16 pairs took 57 ms on one CPU thread (about 3 steps of a full
# batch), 64 pairs 236 ms.
ALIGN_PAIRS_PER_TURN = 16


class ApiError(Exception):
    """An error answered with `status` and a JSON body {"error": code, "detail": message}."""

    def __init__(self, status: int, code: str, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail, self.headers = status, code, detail, headers or {}


def pair_of(model: str) -> str:
    """'en-de' from a model name or a directory such as .../opus-mt-en-de."""
    name = resolve_model_path(model).name
    match = re.search(r"([a-z]{2,3})-([a-z]{2,3})$", name)
    if not match:
        raise ValueError(f"cannot tell the language pair of model {model!r}: name its directory like 'en-de'")
    return f"{match.group(1)}-{match.group(2)}"


@serve.deployment(max_ongoing_requests=512, health_check_period_s=10)
class PairModel:
    """One language pair's model and batching engine on one replica (GPU-resident when there is one)."""

    def __init__(self, model: str, settings: dict[str, Any]) -> None:
        local_ray.pin_replica_grpc()
        s = Settings(**settings)
        threads = s.threads or max(1, math.ceil(s.replica_cpus))
        self.pair = pair_of(model)
        self.translator = Translator.load(model, s.device, dtype=s.dtype, num_threads=threads)
        self.metrics = ModelMetrics(self.pair)
        self.metrics.load_time = self.translator.load_seconds
        self.engine = Engine(self.translator, self._sized(s.model_dump()), max_length=s.max_decoding_length)
        # Warm up on the engine's thread, the only one that runs the model (Translator.load says why).
        self.engine.warm_up([self.translator.encode(WARMUP)])
        self.engine.observer = self.metrics  # the warm-up is not traffic
        self.ready = True

    def reconfigure(self, config: dict[str, Any]) -> None:
        """Serve's user_config: batching knobs, applied live."""
        self.engine.reconfigure(self._sized(config))

    def _sized(self, config: dict[str, Any]) -> BatchingConfig:
        return sized_for(self.translator.device.type, config)

    async def translate(self, texts: list[str], options: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        opts = DecodeOptions(**options)
        try:
            sources = [self.translator.encode(t) for t in texts]
        except InputTooLongError as exc:
            return {"status": 422, "error": "input_too_long", "detail": str(exc)}
        except InvalidTextError as exc:  # the gateway checks first; this keeps the replica's own answer a 422
            return {"status": 422, "error": "invalid_text", "detail": str(exc)}
        try:
            hyps = await self.engine.translate(sources, opts, timeout_s)
        except RequestTooLargeError as exc:
            return {"status": 422, "error": "too_many_texts", "detail": str(exc)}
        except QueueFullError as exc:
            return {"status": 503, "error": "overloaded", "detail": str(exc), "retry_after": exc.retry_after_s}
        except DeadlineExceededError as exc:
            return {"status": 504, "error": "timeout", "detail": str(exc)}
        decode = self.translator.tokenizer.decode
        return {
            "status": 200,
            "translations": [[(decode(h.tokens), h.score) for h in hs] for hs in hyps],
            "source_tokens": sum(len(s) for s in sources),
            "target_tokens": sum(len(hs[0].tokens) + 1 for hs, s in zip(hyps, sources, strict=True) if s),
        }

    async def align(self, pairs: list[tuple[str, str]]) -> dict[str, Any]:
        """Per (source, translation) pair, each target token's character span and that of the source token
        it attends to most, as [t_start, t_end, s_start, s_end] lists; computed on the engine's thread, a
        few pairs a turn so that decoder steps go on in between."""
        links: list[list[Any]] = []
        try:
            for start in range(0, len(pairs), ALIGN_PAIRS_PER_TURN):
                chunk = pairs[start : start + ALIGN_PAIRS_PER_TURN]
                links += await asyncio.wrap_future(self.engine.call(partial(self.translator.align, chunk)))
        except InputTooLongError as exc:
            return {"status": 422, "error": "input_too_long", "detail": str(exc)}
        except InvalidTextError as exc:
            return {"status": 422, "error": "invalid_text", "detail": str(exc)}
        return {"status": 200, "links": [[[*k.target, *k.source] for k in pair] for pair in links]}

    def info(self) -> dict[str, Any]:
        tr = self.translator
        stats = self.engine.stats
        return {
            "name": self.pair, "source": self.pair.split("-")[0], "target": self.pair.split("-")[1],
            "device": str(tr.device), "dtype": str(tr.dtype).removeprefix("torch."),
            "max_source_tokens": tr.max_source_tokens, "ready": self.ready,
            "queued": self.engine.queued, "active": self.engine.active, "batches": stats.batches,
            "batched_sentences": stats.sentences, "max_batch_sentences": stats.max_sentences,
            "rejected": stats.rejected, "expired": stats.expired, "cancelled": stats.cancelled,
            "padded_tokens": stats.padded_tokens, "real_tokens": stats.real_tokens, "steps": stats.steps,
            "config": vars(self.engine.config),
        }


app = FastAPI(
    title="beamserve", version="0.1.0",
    description="Machine translation with Marian-compatible Transformers, beam search and continuous batching.",
)


class _BodyTooLargeError(Exception):
    pass


class BodyLimit:
    """413 for bodies over app.state.max_body_bytes, by Content-Length or while streaming."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.inner(scope, receive, send)
        limit = BODY_LIMIT["bytes"]
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await self._reject(send, limit)
        seen = 0

        async def limited() -> Any:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                raise _BodyTooLargeError
            return message

        try:
            await self.inner(scope, limited, send)
        except _BodyTooLargeError:
            await self._reject(send, limit)

    @staticmethod
    async def _reject(send: Any, limit: int) -> None:
        body = json.dumps({"error": "body_too_large", "detail": f"request body over {limit} bytes"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


app.add_middleware(BodyLimit)
ENDPOINTS = {"/v1/translate", "/translate", "/languages", "/v1/models", "/v1/stats", "/healthz", "/readyz"}


@app.middleware("http")
async def _record(request: Request, call_next: Any) -> Any:
    """Count every request by endpoint, pair and status, with its latency (bounded label values only)."""
    start = time.perf_counter()
    response = await call_next(request)
    endpoint = request.url.path if request.url.path in ENDPOINTS else "other"
    pair = getattr(request.state, "pair", "")
    gateway_metrics().observe(endpoint, pair, response.status_code, time.perf_counter() - start)
    return response


@app.exception_handler(ApiError)
async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return JSONResponse({"error": exc.code, "detail": exc.detail}, status_code=exc.status, headers=exc.headers)


@app.exception_handler(RequestValidationError)
async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = [{"loc": list(e.get("loc", [])), "msg": e.get("msg", "")} for e in exc.errors()]
    return JSONResponse({"error": "invalid_request", "detail": errors}, status_code=422)


async def _libre_body(request: Request) -> dict[str, Any]:
    kind = request.headers.get("content-type", "")
    if kind.startswith("application/json"):
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            raise ApiError(400, "invalid_json", "the body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "invalid_request", "the JSON body must be an object")
        return body
    form = await request.form()
    data: dict[str, Any] = {}
    for key in form:
        values = form.getlist(key)
        data[key] = values if key == "q" and len(values) > 1 else values[0]
    return data


@serve.deployment(max_ongoing_requests=1024, ray_actor_options={"num_cpus": 0})
@serve.ingress(app)
class Gateway:
    """HTTP ingress: validates, routes by (source, target) to the pair's deployment, maps errors."""

    def __init__(self, pairs: dict[str, DeploymentHandle[Any]], settings: dict[str, Any]) -> None:
        local_ray.pin_replica_grpc()
        self.pairs = pairs
        self.settings = Settings(**settings)
        BODY_LIMIT["bytes"] = self.settings.max_body_bytes
        gateway_metrics()

    @app.post("/v1/translate", response_model=TranslateResponse,
              responses={code: {"model": ErrorResponse} for code in (400, 413, 422, 503, 504)})
    async def translate(self, req: TranslateRequest, request: Request) -> TranslateResponse:
        pair, opts = self._check(req, request)
        if req.tag_handling == "html":
            docs = [HtmlDocument(t) for t in req.texts]
            out, nbest = await self._html(pair, docs, opts, req.num_hypotheses, req.timeout_s,
                                          split=req.split_sentences)
            out["translations"] = nbest
        else:
            out = await self._call(pair, req.texts, opts, req.timeout_s, split=req.split_sentences)
        translations = [
            Translation(text=hs[0][0], score=hs[0][1],
                        hypotheses=[h[0] for h in hs] if req.num_hypotheses > 1 else None,
                        scores=[h[1] for h in hs] if req.num_hypotheses > 1 else None)
            for hs in out["translations"]
        ]
        usage = Usage(source_tokens=out["source_tokens"], target_tokens=out["target_tokens"])
        return TranslateResponse(model=pair, translations=translations, usage=usage)

    @app.post("/translate", responses={code: {"model": ErrorResponse} for code in (400, 413, 422, 503, 504)})
    async def libretranslate(self, request: Request) -> dict[str, Any]:
        """LibreTranslate-compatible: JSON or form body with q (string or list), source, target, alternatives."""
        body = await _libre_body(request)
        q = body.get("q")
        texts = [q] if isinstance(q, str) else q
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise ApiError(400, "invalid_request", "q must be a non-empty string or list of strings")
        if body.get("source") == "auto":
            raise ApiError(400, "invalid_request", "language detection is not supported: pass source explicitly")
        if body.get("format", "text") not in ("text", "html"):
            raise ApiError(400, "invalid_request", "format must be 'text' or 'html'")
        # HTML: runs of prose are translated, inline markup carried over by alignment (service/html_text.py).
        docs = [HtmlDocument(t) for t in texts] if body.get("format") == "html" else None
        segments = [node for doc in docs for node in doc.texts] if docs is not None else texts
        try:
            alternatives = int(body.get("alternatives", 0) or 0)
        except (TypeError, ValueError):
            raise ApiError(400, "invalid_request", "alternatives must be an integer") from None
        if not 0 <= alternatives < self.settings.max_beam_size:
            limit = self.settings.max_beam_size - 1
            raise ApiError(400, "invalid_request", f"alternatives must be between 0 and {limit}")
        try:
            req = TranslateRequest.model_validate({
                # A document of markup alone still goes through the checks (with one empty text).
                "texts": segments or [""], "source": str(body.get("source", "")),
                "target": str(body.get("target", "")),
                "beam_size": max(4, alternatives + 1), "num_hypotheses": alternatives + 1,
            })
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ApiError(400, "invalid_request", problems) from None
        pair, opts = self._check(req, request)
        if docs is not None:
            nbest = [[t for t, _ in ranks] for ranks in (await self._html(pair, docs, opts, alternatives + 1))[1]]
        else:
            nbest = [[h[0] for h in hs] for hs in (await self._call(pair, req.texts, opts))["translations"]]
        best = [n[0] for n in nbest]
        alts = [n[1:] for n in nbest]
        result: dict[str, Any] = {"translatedText": best[0] if isinstance(q, str) else best}
        if alternatives:
            result["alternatives"] = alts[0] if isinstance(q, str) else alts
        return result

    @app.get("/languages", response_model=list[Language])
    async def languages(self) -> list[Language]:
        targets: dict[str, list[str]] = {}
        for pair in sorted(self.pairs):
            src, tgt = pair.split("-")
            targets.setdefault(src, []).append(tgt)
            targets.setdefault(tgt, [])
        return [Language(code=c, name=LANGUAGES.get(c, c), targets=t) for c, t in sorted(targets.items())]

    async def _infos(self) -> list[dict[str, Any]]:
        """Every pair replica's info() (see PairModel.info)."""
        return list(await asyncio.gather(*(h.info.remote() for h in self.pairs.values())))

    @app.get("/v1/models", response_model=ModelsResponse)
    async def models(self) -> ModelsResponse:
        infos = await self._infos()
        return ModelsResponse(models=[ModelInfo(**{k: i[k] for k in ModelInfo.model_fields}) for i in infos])

    @app.get("/v1/stats")
    async def stats(self) -> dict[str, Any]:
        """Per pair: queue depth, active sentences, batches and their sizes (for operators and tests)."""
        return {i["name"]: i for i in await self._infos()}

    @app.get("/healthz")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(self) -> JSONResponse:
        try:
            infos = await asyncio.wait_for(self._infos(), 5.0)
        except Exception as exc:  # a replica that cannot answer is not ready
            return JSONResponse({"status": "not ready", "detail": str(exc)}, status_code=503)
        ready = all(i["ready"] for i in infos)
        return JSONResponse({"status": "ready" if ready else "not ready", "models": [i["name"] for i in infos]},
                            status_code=200 if ready else 503)

    def _check(self, req: TranslateRequest, request: Request) -> tuple[str, dict[str, Any]]:
        s = self.settings
        pair = f"{req.source}-{req.target}"
        request.state.pair = pair if pair in self.pairs else "unknown"
        if pair not in self.pairs:
            raise ApiError(400, "unsupported_pair",
                           f"no model for {req.source} -> {req.target}; served pairs: {', '.join(sorted(self.pairs))}")
        if len(req.texts) > s.max_texts:
            raise ApiError(422, "too_many_texts", f"{len(req.texts)} texts; at most {s.max_texts} per request")
        for i, text in enumerate(req.texts):
            if len(text) > s.max_text_chars:
                raise ApiError(422, "text_too_long",
                               f"texts[{i}] has {len(text)} characters; at most {s.max_text_chars}")
            try:
                check_text(text)
            except InvalidTextError as exc:
                raise ApiError(422, "invalid_text", f"texts[{i}]: {exc}") from None
        if req.beam_size > s.max_beam_size:
            raise ApiError(422, "invalid_request", f"beam_size must be between 1 and {s.max_beam_size}")
        if req.num_hypotheses > req.beam_size:
            raise ApiError(422, "invalid_request", "num_hypotheses must not exceed beam_size")
        max_len = min(req.max_decoding_length or s.max_decoding_length, s.max_decoding_length)
        if req.min_decoding_length >= max_len:
            raise ApiError(422, "invalid_request", f"min_decoding_length must be below max_decoding_length "
                                                   f"({max_len}), got {req.min_decoding_length}")
        opts = dict(beam_size=req.beam_size, num_hypotheses=req.num_hypotheses, length_penalty=req.length_penalty,
                    max_decoding_length=max_len, min_decoding_length=req.min_decoding_length,
                    early_stopping=req.early_stopping, no_repeat_ngram_size=req.no_repeat_ngram_size)
        return pair, opts

    async def _call(
        self, pair: str, texts: list[str], opts: dict[str, Any], timeout_s: float | None = None, *,
        split: bool = True,
    ) -> dict[str, Any]:
        """Translate texts on the pair's replica; with `split`, each sentence of a text on its own, and
        "translations" holds each text's n-best list of (text, score), its sentences joined back."""
        out, pieces, per_text = await self._sentences(pair, texts, opts, timeout_s, split=split)
        out["translations"] = [join_translations(hyps, seps) for hyps, (_, seps) in zip(per_text, pieces, strict=True)]
        return out

    async def _sentences(
        self, pair: str, texts: list[str], opts: dict[str, Any], timeout_s: float | None = None, *,
        split: bool = True,
    ) -> tuple[dict[str, Any], list[tuple[list[str], list[str]]], list[list[list[tuple[str, float]]]]]:
        """The replica's answer, each text's (sentences, separators), and each sentence's n-best (text, score)."""
        # A one-sentence text goes as it came (what the library gets for it).
        pieces = [split_sentences(t) if split else ([t], []) for t in texts]
        timeout = self._timeout(timeout_s)
        sentences = [sentence for sents, _ in pieces for sentence in sents]
        out = await self._remote(pair, "translate", sentences, opts, timeout, timeout=timeout)
        per_sentence = iter(out["translations"])
        return out, pieces, [[next(per_sentence) for _ in sents] for sents, _ in pieces]

    async def _html(
        self, pair: str, docs: list[HtmlDocument], opts: dict[str, Any], n: int, timeout_s: float | None = None,
        *, split: bool = True,
    ) -> tuple[dict[str, Any], list[list[tuple[str, float]]]]:
        """The replica's answer, and each document's n renderings with scores, best first: its runs translated
        sentence by sentence, the sentences of runs holding inline markup aligned to their translations (rank
        r: every sentence's r-th hypothesis; its score the mean of theirs, as for a paragraph)."""
        deadline = time.monotonic() + self._timeout(timeout_s)
        texts = [text for doc in docs for text in doc.texts]
        out, pieces, per_run = await self._sentences(pair, texts, opts, timeout_s, split=split)

        needs = [needs for doc in docs for needs in doc.needs_alignment]
        wanted: dict[tuple[str, str], int] = {}
        for aligned, (sents, _), hyps in zip(needs, pieces, per_run, strict=True):
            for r in range(n if aligned else 0):
                for sentence, (translation, _) in zip(sents, ranked(hyps, r), strict=True):
                    wanted.setdefault((sentence, translation), len(wanted))
        # The alignment gets what is left of the request's time.
        left = max(0.1, deadline - time.monotonic())
        links = (await self._remote(pair, "align", list(wanted), timeout=left))["links"] if wanted else []
        renders, k = [], 0
        for doc in docs:
            ranks = []
            for r in range(n):
                run_texts, run_links, scores = [], [], []
                for j in range(k, k + len(doc.texts)):
                    (sents, seps), picked = pieces[j], ranked(per_run[j], r)
                    words = [t for t, _ in picked]
                    found = [links[wanted[p]] for p in zip(sents, words, strict=True)] if needs[j] else []
                    text, joined = join_aligned(sents, seps, words, found or [[] for _ in sents])
                    run_texts.append(text)
                    run_links.append(joined)
                    scores += [score for _, score in picked]
                ranks.append((doc.render(run_texts, run_links), sum(scores) / len(scores) if scores else 0.0))
            renders.append(ranks)
            k += len(doc.texts)
        return out, renders

    def _timeout(self, timeout_s: float | None = None) -> float:
        """A request's timeout: its own when shorter than the server's."""
        return min(timeout_s or self.settings.request_timeout_s, self.settings.request_timeout_s)

    async def _remote(self, pair: str, method: str, *args: Any, timeout: float) -> dict[str, Any]:
        """pair's replica.method(*args), answered within timeout (+2 s); its error answer as an ApiError."""
        response = getattr(self.pairs[pair], method).remote(*args)

        async def answer() -> dict[str, Any]:
            return await response

        try:
            out = await asyncio.wait_for(answer(), timeout + 2.0)
        except TimeoutError:
            response.cancel()
            raise ApiError(504, "timeout", f"no answer within {timeout:.0f}s") from None
        if out["status"] != 200:
            headers = {"Retry-After": str(math.ceil(out["retry_after"]))} if "retry_after" in out else None
            raise ApiError(out["status"], out["error"], out["detail"], headers)
        return out


def build_app(args: dict[str, Any] | None = None) -> serve.Application:
    """Application builder for `serve run service.app:build_app` and the Serve config's import_path.

    args (all optional) are Settings fields, e.g. {"models": "en-de,en-fr", "replica_cpus": 1}.
    """
    settings = Settings(**(args or {}))
    import torch

    gpus = settings.replica_gpus if settings.replica_gpus is not None else (1 if torch.cuda.is_available() else 0)
    pairs: dict[str, Any] = {}
    for model in settings.model_list():
        pair = pair_of(model)
        pairs[pair] = PairModel.options(  # type: ignore[attr-defined]
            name=f"model-{pair}",
            ray_actor_options={"num_cpus": settings.replica_cpus, "num_gpus": gpus},
            user_config=batching_knobs(settings.model_dump()),
        ).bind(model, settings.model_dump())
    return Gateway.bind(pairs, settings.model_dump())  # type: ignore[attr-defined]
