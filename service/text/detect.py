"""Language identification for requests without a source language (LibreTranslate's "auto", DeepL's
and /v1/translate's omitted source): py3langid, whose model ships inside its wheel (nothing is
downloaded).

A text is first identified among every language the identifier knows (140): one that gives the served
languages together too little probability (below) is in a language no model serves, and is named (the
router answers it with a 400), never taken for the nearest served one. Every other text is
ranked among the served languages alone, which is what makes short texts reliable: on Multi30k's test
sets (en, de, fr) every sentence is identified correctly among those three, and none of them (nor its
first five words) is taken for an unserved language; every sentence of tests/data/detect (es, it, nl,
pl, pt) is named as unserved (loadtests/bench_detect.py).
"""

from __future__ import annotations

import html
import logging
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace

from service.text.html_text import TAG

logger = logging.getLogger(__name__)
_LETTER = re.compile(r"[^\W\d_]")  # a letter of any script: what identification needs


# A text whose served languages are together less likely than this is in none of them: SERVED_MASS_MAX
# from MIN_WORDS words on, SHORT_MASS_MAX below (a short text shares n-grams with many languages; one
# that shares none with the served ones, in another script most often, is still named). On Multi30k's
# en, de and fr test sets no sentence, nor its first 1 to 5 words, falls under them (bench_detect.py).
MIN_WORDS = 5
SERVED_MASS_MAX = 0.02
SHORT_MASS_MAX = 0.001
ECHO_MIN = 0.9  # a text ranked at least this sure is answered as already in the target (under it, 400 ambiguous)
NO_LANGUAGE = "zxx"  # the identifier's label for text with no linguistic content


@dataclass(frozen=True)
class Detected:
    language: str  # ISO 639-1 code (639-3 for languages without one)
    confidence: float  # 0-1, the identifier's probability among the candidates; 0 for no evidence
    served: bool = True  # False: identified among every language as one that no model serves
    ambiguous: bool = False  # ranked under ECHO_MIN among the served languages: not sure enough to echo


class LanguageDetector:
    """Identifies a text's language among `languages` (codes the identifier does not know are left
    out, with a warning)."""

    def __init__(self, languages: Iterable[str]) -> None:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier

        # Over every language it knows. The ranking among the served ones is the same probabilities
        # renormalised over them: a softmax restricted to some classes is the full one's share of them.
        self._ident = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        known = set(self._ident.labels)
        wanted = list(dict.fromkeys(languages))
        unknown = [code for code in wanted if code not in known]
        if unknown:
            logger.warning("language detection cannot recognise %s; they are not detected", ", ".join(unknown))
        self.languages = tuple(code for code in wanted if code in known)

    def rank(self, text: str, *, markup: bool = False) -> list[Detected]:
        """Every served language for text, most likely first (markup: text is HTML, tags ignored); or,
        for a text in a language no model serves, that language alone (served False)."""
        if not self.languages:
            return []
        plain = html.unescape(TAG.sub(" ", text)) if markup else text
        if not _LETTER.search(plain):
            return [Detected(code, 0.0) for code in self.languages]
        every = self._ident.rank(plain)
        served = [(code, p) for code, p in every if code in self.languages]
        mass = sum(p for _, p in served)
        long = len(plain.split()) >= MIN_WORDS
        top, top_p = every[0]
        if mass < (SERVED_MASS_MAX if long else SHORT_MASS_MAX) and top != NO_LANGUAGE:
            return [Detected(top, round(top_p, 4), served=False)]
        if mass == 0:  # no linguistic content, and nothing of any served language
            return [Detected(code, 0.0) for code in self.languages]
        ranks = [Detected(code, round(p / mass, 4)) for code, p in served]
        if ranks[0].confidence < ECHO_MIN:  # short texts most of all: "Hola amigos" ranks English at 0.39
            ranks[0] = replace(ranks[0], ambiguous=True)
        return ranks

    def detect(self, texts: list[str], *, markup: bool = False) -> list[Detected]:
        """Each text's language. A text with no letters (a number, an empty string) has no evidence of
        its own: it is taken to be in the language most of the others are in, with confidence 0."""
        ranks = [self.rank(text, markup=markup) for text in texts]
        found = [r[0] if r and r[0].confidence > 0 else None for r in ranks]
        counts = Counter(d.language for d in found if d is not None and d.served)
        fallback = counts.most_common(1)[0][0] if counts else (self.languages[0] if self.languages else "")
        return [d if d is not None else Detected(fallback, 0.0) for d in found]
