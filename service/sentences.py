"""Paragraphs into sentences: the models translate one sentence at a time (DeepL's split_sentences).

A model trained on sentences, given a paragraph, translates its first sentence or two and stops: the
rest of the text would be accepted and lost. A boundary is a line break, or . ! ? (or an ellipsis),
optionally closed by quotes or brackets, then whitespace, then a capital letter or digit (optionally
behind an opening quote or bracket). Not after an initial ("J. Smith") or a common abbreviation
("Mr.", "e.g."), so "E.S.E. Electronics" and "Dr. Who" stay whole.
"""

from __future__ import annotations

import re
from typing import TypeVar

ABBREVIATIONS = frozenset(
    {
        "mr",
        "mrs",
        "ms",
        "dr",
        "prof",
        "sr",
        "jr",
        "st",
        "mt",
        "vs",
        "etc",
        "e.g",
        "i.e",
        "cf",
        "fig",
        "no",
        "nos",
        "vol",
        "co",
        "corp",
        "inc",
        "ltd",
        "jan",
        "feb",
        "mar",
        "apr",
        "jun",
        "jul",
        "aug",
        "sep",
        "sept",
        "oct",
        "nov",
        "dec",
        "approx",
        "dept",
        "est",
        "gen",
        "gov",
        "lt",
        "col",
        "sgt",
        "capt",
        "rev",
        "ave",
        "blvd",
        "rd",
        "hr",
        "min",
        "sec",
        "p.m",
        "a.m",
        "u.s",
        "u.k",
        "z.b",
        "bzw",
        "usw",
        "ca",
        "nr",
        "str",
    }
)
T = TypeVar("T")
_CLOSE = r"[\"'\u201d\u2019)\]]*"  # closing quotes and brackets after the full stop
_OPEN = r"[\"'\u201c\u201e\u2018(\[\u00bf\u00a1]*"  # opening ones before the next sentence's first letter
_END = re.compile(rf"[.!?\u2026]+{_CLOSE}(?P<ws>\s+)(?={_OPEN}(?P<next>\w))")
_LINE = re.compile(r"[^\S\n]*\n\s*")
_LAST_WORD = re.compile(rf"(\S+?)[.!?\u2026]+{_CLOSE}$")


def split_sentences(text: str) -> tuple[list[str], list[str]]:
    """text -> (sentences, separators) with text == s[0] + sep[0] + s[1] + ... + s[-1].

    A text without a boundary (or a blank one) comes back whole, as one sentence. The text's leading
    and trailing whitespace stay on its first and last sentences (a tokenizer ignores them).
    """
    body = text.strip()
    cuts: list[tuple[int, int]] = []  # (sentence end, next sentence start)
    for m in _END.finditer(body):
        nxt = m.group("next")
        if not (nxt.isupper() or nxt.isdigit()):
            continue
        word = _LAST_WORD.search(body, 0, m.start("ws"))
        if word is not None and _abbreviation(word.group(1)):
            continue
        cuts.append(m.span("ws"))
    cuts += [m.span() for m in _LINE.finditer(body)]
    sentences, separators, start = [], [], 0
    for end, nxt in sorted(set(cuts)):
        if end < start:  # a line break inside a gap already cut
            continue
        sentences.append(body[start:end])
        separators.append(body[end:nxt])
        start = nxt
    sentences.append(body[start:])
    lead = text[: len(text) - len(text.lstrip())]
    sentences[0] = lead + sentences[0]
    sentences[-1] += text[len(lead) + len(body) :]
    return sentences, separators


def _abbreviation(word: str) -> bool:
    word = word.lstrip("\"'(\u201c\u201e\u2018[").lower()
    return len(word.replace(".", "")) == 1 or word in ABBREVIATIONS or ("." in word and len(word) <= 6)


def join_translations(
    nbest: list[list[tuple[str, float]]],
    separators: list[str],
) -> list[tuple[str, float]]:
    """A text's n-best from its sentences' n-best lists (text, score): rank r joins every sentence's r-th
    hypothesis (or its last, where its list is shorter); its score is the mean of theirs."""
    if len(nbest) == 1:
        return nbest[0]
    out = []
    for r in range(max(map(len, nbest))):
        picked = ranked(nbest, r)
        out.append((join_sentences([t for t, _ in picked], separators), sum(s for _, s in picked) / len(picked)))
    return out


def ranked(nbest: list[list[T]], r: int) -> list[T]:
    """Each sentence's r-th hypothesis, or its last where its list is shorter."""
    return [hyps[min(r, len(hyps) - 1)] for hyps in nbest]


def join_sentences(translations: list[str], separators: list[str]) -> str:
    """Translated sentences with the original separators between them (split_sentences' inverse)."""
    out = [translations[0]]
    for sep, sentence in zip(separators, translations[1:], strict=True):
        out += [sep, sentence]
    return "".join(out)
