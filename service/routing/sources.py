"""A request's texts grouped by source language: all of them under the source it names, or each under
its detected language, among the languages served."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from service import tracing
from service.errors import ApiError
from service.routing.request_checks import RequestChecks
from service.routing.served_pairs import ServedPairs
from service.text.detect import Detected, LanguageDetector
from service.text.languages import name as language_name

DETECT_CHARS = 1000  # the characters of a text that language detection looks at
DETECT_INLINE_CHARS = 4000  # detection over more characters than this runs off the event loop


class Sources:
    def __init__(self, served: ServedPairs, checks: RequestChecks) -> None:
        self.served, self.checks = served, checks
        # Candidates: every language served, source or target, so a text already in the target language is
        # recognised (and returned as it is) and one with no model is named. Loaded beside the replica's
        # start (0.7 s), not in its way: a restarted gateway answers sooner.
        loader = ThreadPoolExecutor(1, "detector")
        languages = [lang for pair in served.direct for lang in pair.split("-")]
        self._detector = loader.submit(LanguageDetector, languages)
        loader.shutdown(wait=False)  # its thread ends once the detector is loaded

    @property
    def detector(self) -> LanguageDetector:
        return self._detector.result()

    async def group(
        self, source: str | None, target: str, texts: list[str], *, markup: bool
    ) -> tuple[list[Detected] | None, dict[str, list[int]]]:
        """The indices of the texts in each source language, and each text's detected language when the
        request named none (None or "auto"). A detected language with no model to target is a 400 that
        names it; detection looks at the first DETECT_CHARS characters of a text (evidence enough)."""
        if source not in (None, "auto"):
            return None, {source: list(range(len(texts)))}
        if not self.detector.languages:
            raise ApiError("detection_unavailable", "no served language can be detected: pass the source language")
        self.checks.count(texts)
        heads = [t[:DETECT_CHARS] for t in texts]
        with tracing.span("detect", **{"beamserve.texts": len(texts)}):
            if sum(map(len, heads)) > DETECT_INLINE_CHARS:
                detected = await asyncio.to_thread(self.detector.detect, heads, markup=markup)
            else:
                detected = self.detector.detect(heads, markup=markup)
        groups: dict[str, list[int]] = {}
        for i, found in enumerate(detected):
            groups.setdefault(found.language, []).append(i)
        for language, idx in groups.items():
            if language != target and not self.served.serves(f"{language}-{target}"):
                raise ApiError(
                    "unsupported_pair",
                    f"texts[{idx[0]}] is in {language_name(language)} ({language}), detected; no model "
                    f"for {language} -> {target}; {self.served.listed()}",
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
