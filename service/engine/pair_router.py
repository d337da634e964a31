"""How a request's texts become calls to the pair replicas: grouped by source language (named or
detected), split into sentences, answered from the cache where it can, decoded on the pair's
replica (asked again once if the replica dies), HTML put back together by alignment. The HTTP
routes (service/api/gateway.py) sit on top of this.
"""

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol, TypeVar

from ray.serve.handle import DeploymentHandle

from model.errors import InvalidTextError, check_text
from model.options import DecodeOptions, user_options
from service.api import libretranslate, request_log
from service.api.error_codes import RETRY_AFTER_S
from service.api.errors import ApiError, api_error, retry_after
from service.api.schemas import DetectedLanguage, TranslateRequest, TranslateResponse, Translation, Usage
from service.cache import Entry, TranslationCache
from service.engine.admission import PairAdmission
from service.engine.answers import Decoded, NBest, Translated
from service.engine.local_handle import PairHandle
from service.engine.pair_health import PairHealth
from service.metrics import gateway_metrics
from service.settings import Settings
from service.text import glossary
from service.text.detect import Detected, LanguageDetector
from service.text.glossary import Terms
from service.text.html_text import HtmlDocument, join_aligned, parse_documents
from service.text.languages import name as language_name
from service.text.protect import from_html, has_protected, to_html
from service.text.sentences import join_translations, ranked, split_sentences

logger = logging.getLogger(__name__)
RETRY_MIN_S = 1.0  # a call retried after its replica died needs at least this much of its time left
OPTIONS_KEPT = 1024  # combinations of decoding options remembered as checked
# A request's texts are split, and its glossary's terms placed, on the event loop up to this many characters.
SPLIT_INLINE_CHARS = 4000
T = TypeVar("T")
DETECT_CHARS = 1000  # the characters of a text that language detection looks at
MAX_LISTED_PAIRS = 60  # an error message lists the served pairs up to this many
PIVOT = "en"  # a pair with no model of its own goes through it when both halves are served


class Caller(Protocol):
    """Who a translation is for: an HTTP request, or a document's job (service/text/document_jobs.py).
    The router notes on its `state` the pair asked and the characters answered as sent."""

    @property
    def state(self) -> Any: ...


@dataclass(frozen=True)
class Ask:
    """What every step of one translation request shares."""

    pair: str
    opts: DecodeOptions
    timeout_s: float | None = None  # the request's own, capped by the server's
    split: bool = True  # each sentence of a text on its own
    cache: bool = True  # the gateway's cache may answer
    terms: Terms | None = None  # the request's glossary (service/text/glossary.py)


def in_order(groups: dict[str, list[int]], parts: list[list[T]]) -> list[T]:
    """Each group's results (parts[g][j] belongs to text groups[g][j]) back in the texts' order."""
    out: dict[int, T] = {}
    for idx, part in zip(groups.values(), parts, strict=True):
        out.update(zip(idx, part, strict=True))
    return [out[i] for i in range(len(out))]


class PairRouter:
    """Translates texts on the pair deployments: the machinery under the Gateway's routes."""

    def __init__(self, pairs: dict[str, PairHandle], settings: Settings, pooled: dict[str, str] | None = None) -> None:
        """pairs: each pair's deployment, or its model held in this process; pooled: the pairs the model
        pool answers, and their model's name (the multiplexed model id each call carries, so that Serve
        routes it to a replica holding it)."""
        self.pooled = pooled or {}
        self.pairs = {
            pair: handle.options(multiplexed_model_id=self.pooled[pair])
            if pair in self.pooled and isinstance(handle, DeploymentHandle)
            else handle
            for pair, handle in pairs.items()
        }
        self.settings = settings
        # Pairs served through the pivot language: src -> en -> tgt where both halves have a model.
        into = {p.split("-")[0] for p in pairs if p.split("-")[1] == PIVOT}
        out_of = {p.split("-")[1] for p in pairs if p.split("-")[0] == PIVOT}
        self.pivoted = {f"{s}-{t}" for s in into for t in out_of if s != t} - set(pairs)
        # Admission counts the work in flight on a deployment, which the pairs of one model share (a pooled
        # model's pairs each have a handle of their own, carrying its model id).
        served_by: dict[int, list[str]] = {}
        for pair, handle in self.pairs.items():
            served_by.setdefault(id(handle), []).append(pair)
        shared = {
            key: PairAdmission(names[0] if len(names) == 1 else f"the model of {names[0]} ({len(names)} pairs)")
            for key, names in served_by.items()
        }
        self.admission = {pair: shared[id(handle)] for pair, handle in self.pairs.items()}
        self.health = PairHealth(pairs)  # without a model id: a pooled pair's health is the pool's, no load
        self.digests: dict[str, str] = {}  # each pair's model content digest, asked once (the cache's key)
        self._checked: dict[tuple[tuple[str, Any], ...], DecodeOptions] = {}  # the options requests gave, checked
        self.cache = TranslationCache(settings.cache_entries, settings.cache_bytes)
        # Candidates for detection: every language served, source or target, so a text already in the
        # target language is recognised (and returned as it is) and one with no model is named. Loaded
        # beside the replica's start (0.7 s), not in its way: a restarted gateway answers sooner.
        languages = [lang for pair in sorted(pairs) for lang in pair.split("-")]
        self.served_languages = frozenset(languages)  # every language of a served pair, source or target
        loader = ThreadPoolExecutor(1, "detector")
        self._detector = loader.submit(LanguageDetector, languages)
        loader.shutdown(wait=False)  # its thread ends once the detector is loaded

    def served(self) -> str:
        """The served pairs for an error message: listed, or past MAX_LISTED_PAIRS (a model of many
        languages serves thousands) counted, with their languages."""
        if len(self.pairs) <= MAX_LISTED_PAIRS:
            return f"served pairs: {', '.join(sorted(self.pairs))}"
        languages = ", ".join(sorted(self.served_languages))
        return f"{len(self.pairs)} pairs served, among: {languages} (GET /languages lists each one's targets)"

    @property
    def detector(self) -> LanguageDetector:
        return self._detector.result()

    async def translate(self, req: TranslateRequest, request: Caller, terms: Terms | None = None) -> TranslateResponse:
        """The request's texts grouped by source language (named, or detected per text), each group
        translated on its pair (with the glossary's terms when given), the answers in the texts' order."""
        detected, groups = await self._sources(req.source, req.target, req.texts, markup=req.tag_handling == "html")
        if len(groups) == 1:  # one source language: no task to gather
            ((src, idx),) = groups.items()
            parts = [await self._translate_from(req, src, idx, request, terms)]
        else:
            parts = await asyncio.gather(*(self._translate_from(req, s, i, request, terms) for s, i in groups.items()))
        translations = in_order(groups, [done for done, _ in parts])
        if detected is not None:
            translations = [
                t.model_copy(update={"detected_source": DetectedLanguage(**asdict(d))})
                for t, d in zip(translations, detected, strict=True)
            ]
        return TranslateResponse(
            model=",".join(f"{src}-{req.target}" for src in groups if src != req.target),
            translations=translations,
            usage=Usage(
                source_tokens=sum(u.source_tokens for _, u in parts),
                target_tokens=sum(u.target_tokens for _, u in parts),
            ),
        )

    async def _translate_from(
        self, req: TranslateRequest, source: str, idx: list[int], request: Caller, terms: Terms | None
    ) -> tuple[list[Translation], Usage]:
        """req's texts at idx, all in `source`. Texts detected to be in the target language already are
        answered as they are (what DeepL and LibreTranslate do)."""
        texts = [req.texts[i] for i in idx]
        if source == req.target:
            self._check_echo(source, texts, request)
            n = self._options(req).num_hypotheses
            same = [Translation(text=t, score=0.0, hypotheses=[t] if n > 1 else None) for t in texts]
            return same, Usage(source_tokens=0, target_tokens=0)
        if len(texts) != len(req.texts) or source != req.source:  # a group of a detected language
            req = req.model_copy(update={"texts": texts, "source": source})
        pair, opts = self._check(req, request)
        ask = Ask(pair, opts, req.timeout_s, req.split_sentences, req.cache, terms)
        if req.tag_handling == "html":
            ignore = frozenset(t.strip().lower() for t in req.ignore_tags or [])
            docs = await asyncio.to_thread(parse_documents, req.texts, ignore)
            out, renders = await self._html(ask, docs)
            out = replace(out, nbest=renders)
        else:
            out = await self._plain(ask, req.texts)
        n = opts.num_hypotheses
        pivot = PIVOT if pair in self.pivoted else None
        translations = [  # built from the replica's typed answer: nothing to validate
            Translation.model_construct(
                text=hs[0][0],
                score=hs[0][1],
                hypotheses=[h[0] for h in hs] if n > 1 else None,
                scores=[h[1] for h in hs] if n > 1 else None,
                detected_source=None,
                pivot=pivot,
            )
            for hs in out.nbest
        ]
        return translations, Usage(source_tokens=out.source_tokens, target_tokens=out.target_tokens)

    def _check_echo(self, language: str, texts: list[str], request: Caller) -> None:
        """Texts already in the target language, answered as sent: the same checks as a translation (a
        language served, the limits), and their characters refunded to the key (Gateway._billed)."""
        if language not in self.served_languages:
            raise ApiError("unsupported_pair", f"no model for {language} -> {language}; {self.served()}")
        self.check_texts(texts)
        request.state.echoed_characters = getattr(request.state, "echoed_characters", 0) + sum(map(len, texts))

    async def _sources(
        self, source: str | None, target: str, texts: list[str], *, markup: bool
    ) -> tuple[list[Detected] | None, dict[str, list[int]]]:
        """The indices of the texts in each source language, and each text's detected language when the
        request named none (None or "auto"). A detected language with no model to target is a 400 that
        names it; detection looks at the first DETECT_CHARS characters of a text (evidence enough)."""
        if source not in (None, "auto"):
            return None, {source: list(range(len(texts)))}
        if not self.detector.languages:
            raise ApiError("detection_unavailable", "no served language can be detected: pass the source language")
        self.count(texts)
        heads = [t[:DETECT_CHARS] for t in texts]
        if sum(map(len, heads)) > SPLIT_INLINE_CHARS:
            detected = await asyncio.to_thread(self.detector.detect, heads, markup=markup)
        else:
            detected = self.detector.detect(heads, markup=markup)
        groups: dict[str, list[int]] = {}
        for i, found in enumerate(detected):
            groups.setdefault(found.language, []).append(i)
        for language, idx in groups.items():
            if language != target and not self.serves(f"{language}-{target}"):
                raise ApiError(
                    "unsupported_pair",
                    f"texts[{idx[0]}] is in {language_name(language)} ({language}), detected; no model "
                    f"for {language} -> {target}; {self.served()}",
                )
            # Answered as already in the target only when the identifier is sure of it.
            if language == target and (unsure := [i for i in idx if detected[i].ambiguous]):
                found = detected[unsure[0]]
                raise ApiError(
                    "ambiguous_source",
                    f"texts[{unsure[0]}] may be in {language_name(language)} ({language}, detected at "
                    f"{found.confidence:.0%}), the target language, or another: name its source language",
                )
        return detected, groups

    async def libre_texts(
        self, body: dict[str, Any], texts: list[str], single: bool, request: Caller
    ) -> dict[str, Any]:
        source, target = libretranslate.languages_of(body)
        markup = body.get("format") == "html"
        detected, groups = await self._sources(source, target, texts, markup=markup)
        parts = await asyncio.gather(
            *(
                self._libre_part({**body, "q": [texts[i] for i in idx], "source": src}, request)
                for src, idx in groups.items()
            )
        )
        nbest = in_order(groups, list(parts))
        return libretranslate.response(single, libretranslate.alternatives(body), nbest, detected)

    async def _libre_part(self, body: dict[str, Any], request: Caller) -> list[list[str]]:
        """Each text's n-best translations for a LibreTranslate body whose texts share one source; a
        text already in the target language is answered as it is (as LibreTranslate does)."""
        call = await libretranslate.parse(body, self.settings.max_beam_size)
        if call.request.source == call.request.target:
            self._check_echo(call.request.target, body["q"], request)
            return [[t] for t in body["q"]]
        pair, opts = self._check(call.request, request)
        if call.docs is not None:
            return [[t for t, _ in ranks] for ranks in (await self._html(Ask(pair, opts), call.docs))[1]]
        return [[h[0] for h in hs] for hs in (await self._plain(Ask(pair, opts), call.request.texts)).nbest]

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
                row["digest"] = (row.get("pool") or {}).get("digests", {}).get(self.pooled[pair])
            out.append(row)
        return out

    def _check(self, req: TranslateRequest, request: Caller) -> tuple[str, DecodeOptions]:
        """The pair and decoding options of a request, within the server's limits; ApiError otherwise."""
        pair = f"{req.source}-{req.target}"
        request.state.pair = pair if self.serves(pair) else "unknown"
        self.check_pair(req.source or "", req.target)
        request_log.current().add_texts(pair, req.texts)
        self.health.refresh_soon()
        if any(self.health.down(p) for p in self._legs(pair)):  # down or loading: this pair fails, not the pod
            raise ApiError(
                "pair_unavailable",
                f"the {pair} model is not available now; retry later",
                retry_after(RETRY_AFTER_S["pair_unavailable"]),
            )
        self.check_texts(req.texts)
        return pair, self._options(req)

    def check_texts(self, texts: list[str]) -> None:
        """ApiError for more texts than a request may hold, a text too long, or one no model can take."""
        self.count(texts)
        for i, text in enumerate(texts):
            if len(text) > self.settings.max_text_chars:
                raise ApiError(
                    "text_too_long",
                    f"texts[{i}] has {len(text)} characters; at most {self.settings.max_text_chars}",
                )
            try:
                check_text(text)
            except InvalidTextError as exc:
                raise ApiError("invalid_text", f"texts[{i}]: {exc}") from None

    def serves(self, pair: str) -> bool:
        return pair in self.pairs or pair in self.pivoted

    def check_pair(self, source: str, target: str) -> None:
        """ApiError unsupported_pair, naming the pairs served, when no model (nor the pivot) translates it."""
        if not self.serves(f"{source}-{target}"):
            raise ApiError(
                "unsupported_pair",
                f"no model for {source} -> {target}; {self.served()}"
                + (f"; through {PIVOT}: {', '.join(sorted(self.pivoted))}" if self.pivoted else ""),
            )

    def _legs(self, pair: str) -> list[str]:
        """The served pairs a pair goes through: itself, or its two halves through the pivot."""
        if pair not in self.pivoted:
            return [pair]
        source, target = pair.split("-")
        return [f"{source}-{PIVOT}", f"{PIVOT}-{target}"]

    def count(self, texts: list[str]) -> None:
        """ApiError too_many_texts for more texts than a request may hold."""
        if len(texts) > self.settings.max_texts:
            raise ApiError("too_many_texts", f"{len(texts)} texts; at most {self.settings.max_texts} per request")

    def _options(self, req: TranslateRequest) -> DecodeOptions:
        """The request's decoding options within the server's limits; ApiError 422 otherwise. Requests
        repeat a few combinations: each is checked once (OPTIONS_KEPT remembered)."""
        given = tuple((f.name, v) for f in user_options("api") if (v := getattr(req, f.name)) is not None)
        found = self._checked.get(given)
        if found is None:
            found = self._check_options(DecodeOptions(**dict(given)))
            if len(self._checked) >= OPTIONS_KEPT:
                self._checked.clear()
            self._checked[given] = found
        return found

    def _check_options(self, opts: DecodeOptions) -> DecodeOptions:
        s = self.settings
        if opts.beam_size > s.max_beam_size:
            raise ApiError("invalid_request", f"beam_size must be between 1 and {s.max_beam_size}")
        opts = replace(opts, max_decoding_length=min(opts.max_decoding_length, s.max_decoding_length))
        try:
            opts.validate()
        except ValueError as exc:
            raise ApiError("invalid_request", str(exc)) from None
        return opts

    async def _plain(self, ask: Ask, texts: list[str]) -> Translated:
        """_call's answer for plain texts; when one holds a URL, an e-mail address or a placeholder, or
        the request has a glossary, the texts go through the HTML path with those wrapped not to be
        translated (service/text/protect.py) and the glossary's terms marked (service/text/glossary.py)."""
        if ask.terms is None and not any(has_protected(t) for t in texts):
            return await self._call(ask, texts)
        docs = await asyncio.to_thread(parse_documents, [to_html(t) for t in texts])
        out, renders = await self._html(ask, docs)
        return replace(out, nbest=[[(from_html(text), score) for text, score in ranks] for ranks in renders])

    async def _call(self, ask: Ask, texts: list[str]) -> Translated:
        """Translate texts on the pair's replica (with `split`, each sentence of a text on its own): each
        text's n-best, its sentences joined back."""
        out, pieces, per_text = await self._sentences(ask, texts)
        return replace(out, nbest=[join_translations(h, seps) for h, (_, seps) in zip(per_text, pieces, strict=True)])

    async def _sentences(
        self, ask: Ask, texts: list[str]
    ) -> tuple[Translated, list[tuple[list[str], list[str]]], list[list[NBest]]]:
        """The sentences' translation, each text's (sentences, separators), and each sentence's n-best."""

        # A one-sentence text goes as it came (what the library gets for it).
        source = ask.pair.split("-")[0]

        def split_all() -> list[tuple[list[str], list[str]]]:
            return [split_sentences(t, source) if ask.split else ([t], []) for t in texts]

        # Long texts are split off the event loop; a thread hop would cost short ones more than splitting.
        pieces = await asyncio.to_thread(split_all) if sum(map(len, texts)) > SPLIT_INLINE_CHARS else split_all()
        timeout = self._timeout(ask.timeout_s)
        sentences = [sentence for sents, _ in pieces for sentence in sents]
        out = await self._decode(ask.pair, sentences, ask.opts, timeout, cache=ask.cache)
        per_sentence = iter(out.nbest)
        return out, pieces, [[next(per_sentence) for _ in sents] for sents, _ in pieces]

    async def _decode(
        self, pair: str, sentences: list[str], opts: DecodeOptions, timeout: float, *, cache: bool
    ) -> Translated:
        """Each sentence's n-best and the token counts: from the cache where it holds the sentence (with
        `cache`), the rest decoded on the pair's replica, each distinct sentence once. A pair served
        through the pivot: each sentence's best translation into it, then that into the target with
        the request's options, and `pivot` maps each sentence to its pivot translation."""
        if pair in self.pivoted:
            first, second = self._legs(pair)
            deadline = time.monotonic() + timeout
            there = await self._decode(first, sentences, replace(opts, num_hypotheses=1), timeout, cache=cache)
            middle = [nbest[0][0] for nbest in there.nbest]
            left = max(0.1, deadline - time.monotonic())
            out = await self._decode(second, middle, opts, left, cache=cache)
            return replace(out, source_tokens=there.source_tokens, pivot=dict(zip(sentences, middle, strict=True)))
        store = self.cache if cache and self.cache.enabled else None
        digest = await self._digest(pair) if store is not None else ""
        found: dict[str, Entry] = {}
        distinct = list(dict.fromkeys(sentences))
        keys = {s: store.key(digest, pair, opts, s) for s in distinct} if store is not None else {}
        if store is not None:
            for sentence, key in keys.items():
                entry = store.get(key)
                if entry is not None:
                    found[sentence] = entry
            gateway_metrics().on_cache(pair, len(found), len(distinct) - len(found))
        todo = [s for s in distinct if s not in found]
        summary = request_log.current()
        if not todo:
            summary.add_decoded(len(sentences), len(sentences), 0.0, 0.0)
        else:
            with self.admission[pair].holding(len(todo) * opts.beam_size):
                done: Decoded = await self._remote(pair, "translate", pair, todo, opts, timeout=timeout, pass_time=True)
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
        )

    async def _digest(self, pair: str) -> str:
        if pair not in self.digests:
            self.digests[pair] = (await self._remote(pair, "info", timeout=10.0))["digest"]
        return self.digests[pair]

    async def _html(self, ask: Ask, docs: list[HtmlDocument]) -> tuple[Translated, list[NBest]]:
        """The texts' translation, and each document's num_hypotheses renderings with scores, best first: its
        runs translated sentence by sentence, the sentences of runs holding inline markup aligned to their
        translations (rank r: every sentence's r-th hypothesis; its score the mean of theirs, as for a
        paragraph). The request's glossary terms are marked first, to be placed as inline elements."""
        texts = [text for doc in docs for text in doc.texts]
        if ask.terms is not None:  # off the event loop for long texts, as their splitting is
            if sum(map(len, texts)) > SPLIT_INLINE_CHARS:
                await asyncio.to_thread(glossary.apply, docs, ask.terms)
            else:
                glossary.apply(docs, ask.terms)
        n = ask.opts.num_hypotheses
        deadline = time.monotonic() + self._timeout(ask.timeout_s)
        out, pieces, per_run = await self._sentences(ask, texts)

        needs = [needs for doc in docs for needs in doc.needs_alignment]
        wanted: dict[tuple[str, str], int] = {}
        for aligned, (sents, _), hyps in zip(needs, pieces, per_run, strict=True):
            for r in range(n if aligned else 0):
                for sentence, (translation, _) in zip(sents, ranked(hyps, r), strict=True):
                    wanted.setdefault((sentence, translation), len(wanted))
        # The alignment gets what is left of the request's time.
        left = max(0.1, deadline - time.monotonic())
        links: Any
        if not wanted:
            links = []
        elif ask.pair in self.pivoted:
            links = await self._align_through_pivot(ask.pair, list(wanted), out.pivot, left)
        else:
            links = await self._remote(ask.pair, "align", ask.pair, list(wanted), timeout=left)
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

    async def _align_through_pivot(
        self, pair: str, wanted: list[tuple[str, str]], middle: dict[str, str], timeout: float
    ) -> list[list[list[int]]]:
        """Links of (sentence, translation) pairs served through the pivot: each target token to the
        pivot token it attends to most (second model), and that to its source token (first model)."""
        first, second = self._legs(pair)
        there, back = await asyncio.gather(
            self._remote(first, "align", first, [(s, middle[s]) for s, _ in wanted], timeout=timeout),
            self._remote(second, "align", second, [(middle[s], t) for s, t in wanted], timeout=timeout),
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

    def _timeout(self, timeout_s: float | None = None) -> float:
        """A request's timeout: its own when shorter than the server's."""
        return min(timeout_s or self.settings.request_timeout_s, self.settings.request_timeout_s)

    async def _remote(self, pair: str, method: str, *args: Any, timeout: float, pass_time: bool = False) -> Any:
        """pair's replica.method(*args), answered within timeout (+2 s); its typed errors as ApiErrors.
        A replica that dies mid-call is asked again once (Serve routes to a live or restarted one) while
        RETRY_MIN_S of the timeout is left. With pass_time, the time left is the call's last argument."""
        deadline = time.monotonic() + timeout
        for attempt in (1, 2):
            left = deadline - time.monotonic()
            response = getattr(self.pairs[pair], method).remote(*args, *([left] if pass_time else []))
            try:
                async with asyncio.timeout(left + 2.0):  # in this task: wait_for would start one a call
                    result = await response
            except TimeoutError:
                response.cancel()
                raise ApiError("timeout", f"no answer within {timeout:.0f}s") from None
            except Exception as exc:
                known = api_error(exc)
                if known is None:
                    raise
                if known.code == "replica_unavailable" and attempt == 1 and deadline - time.monotonic() > RETRY_MIN_S:
                    logger.warning("the %s replica died mid-request; asking again (%s)", pair, exc)
                    continue
                raise known from None
            if isinstance(result, ApiError):  # a refusal the replica answered (errors.returned)
                raise result
            return result
        raise AssertionError("unreachable")
