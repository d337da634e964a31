"""Language identification for requests without a source language (LibreTranslate's "auto", DeepL's
and /v1/translate's omitted source): py3langid, whose model ships inside its wheel (nothing is
downloaded), restricted to the languages this server serves.

Restricting the candidates is what makes short texts reliable: on Multi30k's test sets (en, de, fr)
every sentence is identified correctly among those three (loadtests/bench_detect.py).
"""

from __future__ import annotations

import html
import logging
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

logger = logging.getLogger(__name__)
_TAG = re.compile(r"<[^>]*>")
_LETTER = re.compile(r"[^\W\d_]")  # a letter of any script: what identification needs


@dataclass(frozen=True)
class Detected:
    language: str  # ISO 639-1 code
    confidence: float  # 0-1, the identifier's probability among the candidates; 0 for no evidence


class LanguageDetector:
    """Identifies a text's language among `languages` (codes the identifier does not know are left
    out, with a warning)."""

    def __init__(self, languages: Iterable[str]) -> None:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier

        self._ident = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        known = set(self._ident.labels)
        wanted = list(dict.fromkeys(languages))
        unknown = [code for code in wanted if code not in known]
        if unknown:
            logger.warning("language detection cannot recognise %s; they are not detected", ", ".join(unknown))
        self.languages = tuple(code for code in wanted if code in known)
        if self.languages:
            self._ident.set_languages(list(self.languages))

    def rank(self, text: str, *, markup: bool = False) -> list[Detected]:
        """Every candidate language for text, most likely first (markup: text is HTML, tags ignored)."""
        if not self.languages:
            return []
        plain = html.unescape(_TAG.sub(" ", text)) if markup else text
        if not _LETTER.search(plain):
            return [Detected(code, 0.0) for code in self.languages]
        return [Detected(code, round(p, 4)) for code, p in self._ident.rank(plain)]

    def detect(self, texts: list[str], *, markup: bool = False) -> list[Detected]:
        """Each text's language. A text with no letters (a number, an empty string) has no evidence of
        its own: it is taken to be in the language most of the others are in, with confidence 0."""
        ranks = [self.rank(text, markup=markup) for text in texts]
        found = [r[0] if r and r[0].confidence > 0 else None for r in ranks]
        counts = Counter(d.language for d in found if d is not None)
        fallback = counts.most_common(1)[0][0] if counts else (self.languages[0] if self.languages else "")
        return [d if d is not None else Detected(fallback, 0.0) for d in found]
