"""Sentences to their n-best translations on the pairs' models: answered from the cache where it holds
them, the rest decoded on the pair's replica (each distinct sentence once, within the pair's admission),
a pair without a model of its own through the pivot language; and the alignments HTML needs, composed
through the pivot the same way."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

from model.decode.confidence import ScoringResult, confidence
from model.options import DecodeOptions
from service import request_log, tracing
from service.engine.answers import Translated
from service.errors import ApiError
from service.metrics import gateway_metrics
from service.routing.admission import PairAdmission
from service.routing.cache import Entry, TranslationCache
from service.routing.pair_client import Links, PairClient
from service.routing.recall import recalled
from service.routing.request_checks import Defaults
from service.routing.served_pairs import PIVOT, ServedPairs
from service.text.memory import Recall

INFO_TIMEOUT_S = 10.0  # a pair's info(), asked once for its model's digest (the cache's key) and decoding defaults


class PairDecoder:
    def __init__(self, clients: dict[str, PairClient], served: ServedPairs, cache: TranslationCache) -> None:
        self.clients, self.served, self.cache = clients, served, cache
        # Admission counts the work in flight on a deployment, which the pairs of one model share (a pooled
        # model's pairs each have a handle of their own, carrying its model id).
        served_by: dict[int, list[str]] = {}
        for pair, client in clients.items():
            served_by.setdefault(id(client.handle), []).append(pair)
        shared = {
            key: PairAdmission(names[0] if len(names) == 1 else f"the model of {names[0]} ({len(names)} pairs)")
            for key, names in served_by.items()
        }
        self.admission = {pair: shared[id(client.handle)] for pair, client in clients.items()}
        self.infos: dict[str, dict[str, Any]] = {}  # each pair's model's info, asked once: its digest and defaults
        self.defaults: dict[str, Defaults] = {}  # each pair's model's defaults, as RequestChecks takes them

    async def decode(
        self,
        pair: str,
        sentences: list[str],
        opts: DecodeOptions,
        timeout: float,
        *,
        cache: bool,
        pieces: bool = False,
        recall: Recall | None = None,
    ) -> Translated:
        """Each sentence's n-best and the token counts: from the request's translation memory where it holds
        the sentence (`recall`), from the cache where it does (with `cache`), the rest decoded on the pair's
        replica, each distinct sentence once. A pair served through the pivot: each sentence's best
        translation into it, then that into the target with the request's options, and `pivot` maps each
        sentence to its pivot translation."""
        if recall is not None:
            return await recalled(
                sentences,
                recall,
                lambda rest: self.decode(pair, rest, opts, timeout, cache=cache, pieces=pieces),
                None if pair in self.served.pivoted else lambda pairs: self.score(pair, pairs, timeout),
                opts.length_penalty,
            )
        if pair in self.served.pivoted:
            first, second = self.served.legs(pair)
            deadline = time.monotonic() + timeout
            there = await self.decode(
                first, sentences, replace(opts, num_hypotheses=1), timeout, cache=cache, pieces=pieces
            )
            middle = [nbest[0][0] for nbest in there.nbest]
            left = max(0.1, deadline - time.monotonic())
            out = await self.decode(second, middle, opts, left, cache=cache, pieces=pieces)
            sure: list[float | None] = [  # both legs' tokens
                a * b if a is not None and b is not None else None
                for a, b in zip(there.confidence, out.confidence, strict=True)
            ]
            return replace(
                out, source_tokens=there.source_tokens, pivot=dict(zip(sentences, middle, strict=True)), confidence=sure
            )
        store = self.cache if cache and self.cache.enabled else None
        digest = await self._digest(pair) if store is not None else ""
        found: dict[str, Entry] = {}
        distinct = list(dict.fromkeys(sentences))
        keys = {s: store.key(digest, pair, opts, s, pieces) for s in distinct} if store is not None else {}
        if store is not None:
            with tracing.span("cache", **{"beamserve.sentences": len(distinct)}) as looked:
                for sentence, key in keys.items():
                    entry = store.get(key)
                    if entry is not None:
                        found[sentence] = entry
                if looked is not None:
                    looked.set_attribute("beamserve.cache.hits", len(found))
            gateway_metrics().on_cache(pair, len(found), len(distinct) - len(found))
        todo = [s for s in distinct if s not in found]
        summary = request_log.current()
        if not todo:
            summary.add_decoded(len(sentences), len(sentences), 0.0, 0.0)
        else:
            with self.admission[pair].holding(len(todo) * opts.beam_size):
                done = await self.clients[pair].translate(todo, opts, timeout, pieces=pieces)
            summary.add_decoded(len(sentences), len(sentences) - len(todo), done.queue_wait_s, done.decode_s)
            for sentence, nbest, (src, tgt) in zip(todo, done.nbest, done.tokens, strict=True):
                entry = Entry([(text, score) for text, score in nbest], src, tgt)
                found[sentence] = entry
                if store is not None:
                    store.put(keys[sentence], entry)
        entries = [found[s] for s in sentences]
        return Translated(
            nbest=[e.nbest for e in entries],
            source_tokens=sum(e.source_tokens for e in entries),
            target_tokens=sum(e.target_tokens for e in entries),
            confidence=[confidence(e.nbest[0][1], e.target_tokens, opts.length_penalty) for e in entries],
        )

    async def score(self, pair: str, pairs: list[tuple[str, str]], timeout: float) -> list[ScoringResult]:
        """Each (sentence, translation)'s tokens scored by the pair's model, within its admission; a pair through
        the pivot has no one model to score it (ApiError)."""
        if pair in self.served.pivoted:
            raise ApiError("unsupported_pair", f"{pair} is translated through {PIVOT} by two models: none scores it")
        with self.admission[pair].holding(len(pairs)):
            return await self.clients[pair].score(pairs, timeout)

    async def align(self, pair: str, wanted: list[tuple[str, str]], pivot: dict[str, str], timeout: float) -> Links:
        """Links of (sentence, translation) pairs; through the pivot (`pivot`: each sentence's translation
        into it), each target token to the pivot token it attends to most (second model), and that to its
        source token (first model)."""
        if pair not in self.served.pivoted:
            return await self.clients[pair].align(wanted, timeout)
        first, second = self.served.legs(pair)
        there, back = await asyncio.gather(
            self.clients[first].align([(s, pivot[s]) for s, _ in wanted], timeout),
            self.clients[second].align([(pivot[s], t) for s, t in wanted], timeout),
        )
        out = []
        for to_pivot, to_target in zip(there, back, strict=True):
            composed = []
            for t_start, t_end, p_start, p_end in to_target:
                # The first model's link whose pivot-side span overlaps this one most.
                best = max(to_pivot, key=lambda k: min(k[1], p_end) - max(k[0], p_start), default=None)
                if best is not None and min(best[1], p_end) > max(best[0], p_start):
                    composed.append([t_start, t_end, best[2], best[3]])
            out.append(composed)
        return out

    async def _digest(self, pair: str) -> str:
        return str((await self._info(pair))["digest"])

    async def model_defaults(self, pair: str) -> Defaults:
        """The decoding options the pair's model's generation_config.json sets, by name (none for a pair through
        the pivot: two models decode it); a request's options are checked by them (RequestChecks.options)."""
        if pair in self.served.pivoted:
            return ()
        if pair not in self.defaults:
            self.defaults[pair] = tuple(sorted(((await self._info(pair)).get("defaults") or {}).items()))
        return self.defaults[pair]

    async def _info(self, pair: str) -> dict[str, Any]:
        if pair not in self.infos:
            self.infos[pair] = await self.clients[pair].info(INFO_TIMEOUT_S)
        return self.infos[pair]
