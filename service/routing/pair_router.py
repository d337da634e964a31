"""How a request's texts become calls to the pair replicas: grouped by source language (named or
detected: routing/sources.py), held to the limits (routing/request_checks.py), split into sentences,
decoded (routing/pair_decoder.py: the cache, the pivot, admission, the replica), HTML put back together
by alignment (text/html_render.py). The HTTP routes (service/api/gateway.py) and the document jobs sit
on top of this.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, TypeVar, cast

from ray.serve.handle import DeploymentHandle

from model.io import model_card
from model.options import DecodeOptions
from service import request_log
from service.engine.answers import NBest, Translated
from service.error_codes import RETRY_AFTER_S
from service.errors import ApiError, retry_after
from service.routing.cache import TranslationCache
from service.routing.local_handle import PairHandle
from service.routing.pair_client import PairClient
from service.routing.pair_decoder import PairDecoder
from service.routing.pair_health import PairHealth
from service.routing.request_checks import RequestChecks
from service.routing.served_pairs import PIVOT, ServedPairs
from service.routing.sources import Sources
from service.schemas import (
    DetectedLanguage,
    MemorySuggestion,
    Scored,
    ScoreRequest,
    ScoreResponse,
    TranslateRequest,
    TranslateResponse,
    Translation,
    Usage,
)
from service.settings import Settings
from service.text import glossary
from service.text.glossary import Terms
from service.text.html_render import alignments_wanted, rendered
from service.text.html_text import HtmlDocument, Link, parse_documents
from service.text.memory import Recall, Suggestion
from service.text.protect import from_html, has_protected, to_html
from service.text.sentences import join_translations, split_sentences

# A request's texts are split, and its glossary's terms placed, on the event loop up to this many characters.
SPLIT_INLINE_CHARS = 4000
T = TypeVar("T")


@dataclass(frozen=True)
class Ask:
    """What every step of one translation request shares."""

    pair: str
    opts: DecodeOptions
    timeout_s: float | None = None  # the request's own, capped by the server's
    split: bool = True  # each sentence of a text on its own
    cache: bool = True  # the gateway's cache may answer
    terms: Terms | None = None  # the request's glossary (service/text/glossary.py)
    pieces: bool = False  # a sentence longer than the model takes translated in pieces, not refused
    recall: Recall | None = None  # the request's translation memory (service/text/memory.py)


@dataclass(frozen=True)
class Routed:
    """A request's answer, and the characters of its texts answered as they came (already in the target
    language): what the key is not charged for."""

    response: TranslateResponse
    echoed_characters: int = 0


def in_order(groups: dict[str, list[int]], parts: list[list[T]]) -> list[T]:
    """Each group's results (parts[g][j] belongs to text groups[g][j]) back in the texts' order."""
    out: dict[int, T] = {}
    for idx, part in zip(groups.values(), parts, strict=True):
        out.update(zip(idx, part, strict=True))
    return [out[i] for i in range(len(out))]


def grouped(recalled: list[list[T]], counts: list[int]) -> list[list[T]]:
    """Consecutive groups' memory matches (or suggestions) joined, `counts` of them to each group (empty
    without a memory)."""
    if not recalled:
        return []
    parts = iter(recalled)
    return [[m for _ in range(n) for m in next(parts)] for n in counts]


def origin(matches: list[float | None]) -> Literal["model", "memory", "mixed"]:
    """Where a text's sentences came from: its memory matches summed up."""
    if matches and all(m is not None for m in matches):
        return "memory"
    return "mixed" if any(m is not None for m in matches) else "model"


def weakest(confidence: list[float | None], counts: list[int]) -> list[float | None]:
    """Each text's confidence, its sentences' `counts[i]` in a row: the least of theirs (the sentence to check
    decides; None for a memory's answer no model scored, where every sentence is such); 1.0 for a text with
    none."""
    out: list[float | None] = []
    at = 0
    for n in counts:
        known = [c for c in confidence[at : at + n] if c is not None]
        out.append(min(known, default=1.0) if known or n == 0 else None)
        at += n
    return out


def offered(near: list[Suggestion | None]) -> list[MemorySuggestion | None]:
    """A text's memory suggestions, each sentence's (None: no unit was offered for it)."""
    return [MemorySuggestion(source=s.source, target=s.target, match=s.match) if s else None for s in near]


class PairRouter:
    """Translates texts on the pair deployments: the machinery under the Gateway's routes."""

    def __init__(self, pairs: dict[str, PairHandle], settings: Settings, pooled: dict[str, str] | None = None) -> None:
        """pairs: each pair's deployment, or its model held in this process; pooled: the pairs the model
        pool answers, and their model's name (the multiplexed model id each call carries, so that Serve
        routes it to a replica holding it)."""
        self.pooled = pooled or {}
        clients = {
            pair: PairClient(
                pair,
                handle.options(multiplexed_model_id=self.pooled[pair])
                if pair in self.pooled and isinstance(handle, DeploymentHandle)
                else handle,
            )
            for pair, handle in pairs.items()
        }
        self.settings = settings
        self.pairs = ServedPairs(pairs)
        self.checks = RequestChecks(settings)
        self.sources = Sources(self.pairs, self.checks)
        self.decoder = PairDecoder(clients, self.pairs, TranslationCache(settings.cache_entries, settings.cache_bytes))
        self.health = PairHealth(pairs)  # without a model id: a pooled pair's health is the pool's, no load

    async def translate(
        self, req: TranslateRequest, terms: Terms | None = None, *, pieces: bool = False, recall: Recall | None = None
    ) -> Routed:
        """The request's texts grouped by source language (named, or detected per text), each group
        translated on its pair (with the glossary's terms when given, the memory's units where it holds a
        sentence), the answers in the texts' order. `pieces`: a sentence longer than the model takes is
        translated in pieces (a document's paragraph)."""
        req = self.languages_of(req)
        markup = req.tag_handling == "html"
        detected, groups = await self.sources.group(req.source, req.target, req.texts, markup=markup)
        if len(groups) == 1:  # one source language: no task to gather
            ((src, idx),) = groups.items()
            parts = [await self._translate_from(req, src, idx, terms, pieces, recall)]
        else:
            parts = await asyncio.gather(
                *(self._translate_from(req, s, i, terms, pieces, recall) for s, i in groups.items())
            )
        translations = in_order(groups, [done for done, _, _ in parts])
        if detected is not None:
            translations = [
                t.model_copy(update={"detected_source": DetectedLanguage(**asdict(d))})
                for t, d in zip(translations, detected, strict=True)
            ]
        response = TranslateResponse(
            model=",".join(f"{src}-{req.target}" for src in groups if src != req.target),
            translations=translations,
            usage=Usage(
                source_tokens=sum(u.source_tokens for _, u, _ in parts),
                target_tokens=sum(u.target_tokens for _, u, _ in parts),
            ),
        )
        return Routed(response, sum(echoed for _, _, echoed in parts))

    async def _translate_from(
        self,
        req: TranslateRequest,
        source: str,
        idx: list[int],
        terms: Terms | None,
        pieces: bool,
        recall: Recall | None = None,
    ) -> tuple[list[Translation], Usage, int]:
        """req's texts at idx, all in `source`, and the characters answered as sent: texts detected to be
        in the target language already come back as they are (what DeepL and LibreTranslate do)."""
        texts = [req.texts[i] for i in idx]
        if source == req.target:
            if source not in self.pairs.languages:
                raise ApiError("unsupported_pair", f"no model for {source} -> {source}; {self.pairs.listed()}")
            self.checks.texts(texts)
            n = self.checks.options(req).num_hypotheses
            same = [Translation(text=t, score=0.0, hypotheses=[t] if n > 1 else None, confidence=None) for t in texts]
            return same, Usage(source_tokens=0, target_tokens=0), sum(map(len, texts))
        if len(texts) != len(req.texts) or source != req.source:  # a group of a detected language
            req = req.model_copy(update={"texts": texts, "source": source})
        docs = None
        if req.tag_handling == "html":  # parsed first: markup past the limits is refused before anything else
            ignore = frozenset(t.strip().lower() for t in req.ignore_tags or [])
            docs = await asyncio.to_thread(parse_documents, req.texts, ignore)
        pair = self._check(req)
        opts = self.checks.options(req, await self.decoder.model_defaults(pair))
        ask = Ask(pair, opts, req.timeout_s, req.split_sentences, req.cache, terms, pieces, recall)
        if docs is not None:
            out, renders = await self._html(ask, docs)
            out = replace(out, nbest=renders)
        else:
            out = await self._plain(ask, req.texts)
        n = opts.num_hypotheses
        pivot = PIVOT if pair in self.pairs.pivoted else None
        recalled = out.recalled or [[] for _ in out.nbest]  # each text's memory matches (none asked: empty)
        suggested = out.suggested or [[] for _ in out.nbest]
        translations = [  # built from the replica's typed answer: nothing to validate
            Translation.model_construct(
                text=hs[0][0],
                score=hs[0][1],
                hypotheses=[h[0] for h in hs] if n > 1 else None,
                scores=[h[1] for h in hs] if n > 1 else None,
                detected_source=None,
                pivot=pivot,
                confidence=round(sure, 4) if sure is not None else None,
                origin=origin(matches) if recall is not None else None,
                memory_matches=matches if recall is not None else None,
                memory_suggestions=offered(near) if recall is not None else None,
            )
            for hs, sure, matches, near in zip(out.nbest, out.confidence, recalled, suggested, strict=True)
        ]
        return translations, Usage(source_tokens=out.source_tokens, target_tokens=out.target_tokens), 0

    async def score(self, req: ScoreRequest) -> ScoreResponse:
        """Each (text, translation)'s tokens scored by the pair's model, teacher-forced (Translator.score): a pair
        its model translates directly, the texts within the server's limits, as a translation's."""
        source, target = self.pairs.code(req.source), self.pairs.code(req.target)
        pair = f"{source}-{target}"
        request_log.current().metric_pair = pair if self.pairs.serves(pair) else "unknown"
        self.pairs.check(source, target)
        self.checks.texts(req.texts)
        self.checks.texts(req.translations)
        self._available(pair, [pair])
        timeout = self.checks.timeout(req.timeout_s)
        found = await self.decoder.score(pair, list(zip(req.texts, req.translations, strict=True)), timeout)
        return ScoreResponse(
            model=pair,
            scores=[
                Scored(
                    tokens=s.tokens,
                    log_probs=s.log_probs,
                    total=s.total,
                    normalized=s.normalized,
                    confidence=round(s.confidence, 6),
                )
                for s in found
            ],
        )

    def languages_of(self, req: TranslateRequest) -> TranslateRequest:
        """The request with its languages as the served codes (`pt-BR` is `pt`, `zh-Hant` is `zt`):
        service/text/language_tags.py."""
        source = self.pairs.code(req.source) if req.source is not None else None
        target = self.pairs.code(req.target)
        if (source, target) == (req.source, req.target):
            return req
        return req.model_copy(update={"source": source, "target": target})

    def _check(self, req: TranslateRequest) -> str:
        """The pair of a request, its texts within the server's limits; ApiError otherwise."""
        pair = f"{req.source}-{req.target}"
        summary = request_log.current()
        summary.metric_pair = pair if self.pairs.serves(pair) else "unknown"
        self.pairs.check(req.source or "", req.target)
        summary.add_texts(pair, req.texts)
        self.health.refresh_soon()
        self._available(pair, self.pairs.legs(pair))
        self.checks.texts(req.texts)
        return pair

    def _available(self, pair: str, legs: list[str]) -> None:
        """503 pair_unavailable where a model `pair` needs is down or loading: this pair fails, not the pod."""
        if any(self.health.down(p) for p in legs):
            raise ApiError(
                "pair_unavailable",
                f"the {pair} model is not available now; retry later",
                retry_after(RETRY_AFTER_S["pair_unavailable"]),
            )

    async def infos(self) -> list[dict[str, Any]]:
        """Per pair, its model replica's info() (see PairModel.info) with the pair's name, source and
        target; a pair whose replica does not answer within pair_health.ASK_S has "ready": False alone."""
        infos = await self.health.ask_all()
        out = []
        for pair, info in infos.items():
            source, target = pair.split("-")
            row = {**(info or {"ready": False}), "name": pair, "source": source, "target": target}
            if pair in self.pooled:  # the pool replica asked reports the digests of the models it holds
                row["model"] = self.pooled[pair]
                held = row.get("pool") or {}
                row["digest"] = held.get("digests", {}).get(self.pooled[pair])
                row["license"] = held.get("licenses", {}).get(self.pooled[pair])
                row["non_commercial"] = model_card.non_commercial(row["license"])
            out.append(row)
        return out

    async def _plain(self, ask: Ask, texts: list[str]) -> Translated:
        """Each text's n-best; when one holds a URL, an e-mail address or a placeholder, or the request has
        a glossary, the texts go through the HTML path with those wrapped not to be translated
        (service/text/protect.py) and the glossary's terms marked (service/text/glossary.py)."""
        if ask.terms is None and not any(has_protected(t) for t in texts):
            out, pieces, per_text = await self._sentences(ask, texts)
            joined = [join_translations(h, seps) for h, (_, seps) in zip(per_text, pieces, strict=True)]
            counts = [len(s) for s, _ in pieces]
            return replace(
                out,
                nbest=joined,
                confidence=weakest(out.confidence, counts),
                recalled=grouped(out.recalled, counts),
                suggested=grouped(out.suggested, counts),
            )
        docs = await asyncio.to_thread(parse_documents, [to_html(t) for t in texts])
        out, renders = await self._html(ask, docs)
        return replace(out, nbest=[[(from_html(text), score) for text, score in ranks] for ranks in renders])

    async def _sentences(
        self, ask: Ask, texts: list[str]
    ) -> tuple[Translated, list[tuple[list[str], list[str]]], list[list[NBest]]]:
        """The sentences' translation (with `split`, each sentence of a text on its own; a one-sentence
        text goes as it came, what the library gets for it), each text's (sentences, separators), and each
        sentence's n-best."""
        source = ask.pair.split("-")[0]

        def split_all() -> list[tuple[list[str], list[str]]]:
            return [split_sentences(t, source) if ask.split else ([t], []) for t in texts]

        # Long texts are split off the event loop; a thread hop would cost short ones more than splitting.
        pieces = await asyncio.to_thread(split_all) if sum(map(len, texts)) > SPLIT_INLINE_CHARS else split_all()
        timeout = self.checks.timeout(ask.timeout_s)
        sentences = [sentence for sents, _ in pieces for sentence in sents]
        out = await self.decoder.decode(
            ask.pair, sentences, ask.opts, timeout, cache=ask.cache, pieces=ask.pieces, recall=ask.recall
        )
        per_sentence = iter(out.nbest)
        return out, pieces, [[next(per_sentence) for _ in sents] for sents, _ in pieces]

    async def _html(self, ask: Ask, docs: list[HtmlDocument]) -> tuple[Translated, list[NBest]]:
        """The texts' translation, and each document's renderings with scores, best first (text/html_render.py).
        The request's glossary terms are marked first, to be placed as inline elements."""
        texts = [text for doc in docs for text in doc.texts]
        if ask.terms is not None:  # off the event loop for long texts, as their splitting is
            if sum(map(len, texts)) > SPLIT_INLINE_CHARS:
                await asyncio.to_thread(glossary.apply, docs, ask.terms)
            else:
                glossary.apply(docs, ask.terms)
        n = ask.opts.num_hypotheses
        deadline = time.monotonic() + self.checks.timeout(ask.timeout_s)
        out, pieces, per_run = await self._sentences(ask, texts)
        wanted = alignments_wanted(docs, pieces, per_run, n)
        links: list[list[Link]] = []
        if wanted:  # the alignment gets what is left of the request's time
            left = max(0.1, deadline - time.monotonic())
            links = cast(list[list[Link]], await self.decoder.align(ask.pair, wanted, out.pivot, left))
        runs = iter(len(sents) for sents, _ in pieces)  # each document's sentences: those of its runs
        per_doc = [sum(next(runs) for _ in doc.texts) for doc in docs]
        out = replace(
            out,
            confidence=weakest(out.confidence, per_doc),
            recalled=grouped(out.recalled, per_doc),
            suggested=grouped(out.suggested, per_doc),
        )
        return out, rendered(docs, pieces, per_run, dict(zip(wanted, links, strict=True)), n)
