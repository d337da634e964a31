"""Paragraphs into sentences: the models translate one sentence at a time (DeepL's split_sentences).

A model trained on sentences, given a paragraph, translates its first sentence or two and stops: a
boundary missed here is text silently lost, one found in error only a sentence translated in two
pieces. A boundary is
- a line break;
- . ! ? or an ellipsis, optionally closed by quotes or brackets, then whitespace, then a capital
  letter, a digit or a letter of a script without case (optionally behind an opening quote or
  bracket), unless the full stop ends a title or a word that precedes what it names (Dr., Nr.,
  z. B.), or a number of up to three digits (an ordinal or a list marker: "am 3. Mai", "1. Open
  it"), an initial or an abbreviation that may end a sentence (J., U.S., p.m., etc.) and the next
  word is not one that starts sentences ("... the U.S. Next year" splits, "the U.S. Army" does not);
- a CJK full stop, exclamation or question mark (。！？), with or without whitespace after it.

Per source language (en, de, fr; others get the union of their lists). One pass over the text: each
candidate looks back at most LOOKBACK characters, so splitting is linear in the text's length.
"""

from __future__ import annotations

import re
from typing import TypeVar

T = TypeVar("T")
LOOKBACK = 48  # characters looked back from a full stop for the word it ends

# Words a full stop after which never ends a sentence: titles and words that precede what they name.
_NEVER_END = {
    "en": "mr mrs ms dr prof rev gen lt col sgt capt gov sen rep mt vs cf fig figs no nos vol vols eg e.g ie i.e "
    "approx ca ch art pp p ed eds dept est op",
    "de": "hr fr dr prof nr bzw vgl z.b z.t u.a d.h s.o s.u ca evtl ggf inkl zzgl abs abt bd str tel geb "
    "gegr dipl ing hrsg jh u.ä o.ä usf sog",
    "fr": "m mm mme mmes mlle mlles mgr me dr pr st ste p.ex cf env art chap vol no fig av apr cie",
}
# Abbreviations that may end a sentence: a boundary when the next word starts sentences.
_MAY_END = {
    "en": "etc inc ltd co corp jr sr st a.m p.m u.s u.k u.s.a e.u bros",
    "de": "usw etc u.s.w gmbh co jr sr",
    "fr": "etc cie jr sr",
}
# Words that start sentences (lower-cased): after an initial or a may-end abbreviation, a boundary.
_STARTERS = {
    "en": "the a an he she it we they i you this that these those there then next but and so in on at after "
    "before when if as his her its our their my your what why how who where one some all no yes however "
    "meanwhile later today tomorrow yesterday",
    "de": "der die das ein eine er sie es wir ich du ihr dann danach aber und doch dies diese dieser heute "
    "morgen gestern am im um wenn als was wie wer warum wo man später dort hier so",
    "fr": "le la les un une il elle ils elles nous vous je on ce cette ces puis ensuite mais et donc "
    "aujourd'hui demain hier dans au quand si que qui pourquoi comment plus",
}


def _words(table: dict[str, str]) -> dict[str, frozenset[str]]:
    every = frozenset(w for words in table.values() for w in words.split())
    return {lang: frozenset(words.split()) for lang, words in table.items()} | {"": every}


NEVER_END, MAY_END, STARTERS = _words(_NEVER_END), _words(_MAY_END), _words(_STARTERS)

# Closing quotes and brackets after a sentence's end (German closes with the marks English opens with).
CLOSERS = "\"'\u201d\u2019\u201c\u2018\u00bb\u203a)]"
OPENERS = "\"'\u201c\u201e\u2018\u00ab([\u00bf\u00a1"  # opening ones before a sentence's first letter
_C, _O = re.escape(CLOSERS), re.escape(OPENERS)
_BOUNDARY = re.compile(
    # French sets a space before ! ? and a closing guillemet: "Viens ! » Elle".
    rf"(?P<stop>[.!?\u2026]+)(?:[^\S\n]?[{_C}])*(?P<ws>\s+)(?=[{_O}]*(?P<next>\w+))"
    rf"|(?P<cjk>[\u3002\uff01\uff1f]+[\u300d\u300f{_C}\uff09]*)(?P<cjk_ws>[^\S\n]*)(?=\S)"
    r"|(?P<line>[^\S\n]*\n\s*)"
)
# Every boundary starts with one of these before the body's last character: a body without one is a sentence.
_MAY_CUT = re.compile(r"[.!?\u2026\u3002\uff01\uff1f\n]")
_NUMBER = re.compile(r"[\d.,]*\d")
_DOTTED = re.compile(r"(?:[^\W\d_]\.)+[^\W\d_]?")  # U.S, e.g, p.m, E.S.E


def split_sentences(text: str, lang: str = "") -> tuple[list[str], list[str]]:
    """text -> (sentences, separators) with text == s[0] + sep[0] + s[1] + ... + s[-1].

    lang: the source language's code (en, de, fr; another or "" uses every list). A text without a
    boundary (or a blank one) comes back whole, as one sentence. The text's leading and trailing
    whitespace stay on its first and last sentences (a tokenizer ignores them).
    """
    body = text.strip()
    if _MAY_CUT.search(body, 0, len(body) - 1) is None:
        return [text], []
    lang = lang if lang in STARTERS else ""
    sentences, separators, start = [], [], 0
    for m in _BOUNDARY.finditer(body):
        if m.group("line") is not None:
            end, nxt = m.span("line")
        elif m.group("cjk") is not None:
            end, nxt = m.span("cjk_ws")
        elif "\n" in m.group("ws") or _ends_sentence(body, m, lang):
            end, nxt = m.span("ws")
        else:
            continue
        if end <= start:  # nothing since the last cut (a line break right after a full stop)
            continue
        sentences.append(body[start:end])
        separators.append(body[end:nxt])
        start = nxt
    sentences.append(body[start:])
    lead = text[: len(text) - len(text.lstrip())]
    sentences[0] = lead + sentences[0]
    sentences[-1] += text[len(lead) + len(body) :]
    return sentences, separators


def _ends_sentence(body: str, m: re.Match[str], lang: str) -> bool:
    nxt = m.group("next")
    first = nxt[0]
    if not (first.isupper() or first.isdigit() or (first.isalpha() and not first.islower())):
        return False  # lower case goes on: "Wait... and then", "e.g. the", '"Stop!" he said'
    if m.group("stop") != ".":
        return True  # ! ? ... and an ellipsis end a sentence before a capital
    # The word the full stop ends: back to the last whitespace, at most LOOKBACK characters.
    stop = m.start("stop")
    begin = stop
    while begin > stop - LOOKBACK and begin > 0 and not body[begin - 1].isspace():
        begin -= 1
    word = body[begin:stop].lstrip(OPENERS).lower()
    if not word:
        return True
    if _NUMBER.fullmatch(word) and not (word.isdigit() and len(word) <= 3):
        return True  # "It costs 3.50. Then", "in 1999. Then"
    if word in NEVER_END[lang] or (lang in ("de", "") and word.endswith("str")):  # "Hauptstr. 5"
        return False
    # An ordinal or list marker ("am 3. Mai", "1. Open"), an initial, or an abbreviation that may end.
    if word.isdigit() or word in MAY_END[lang] or (len(word) == 1 and word.isalpha()) or _DOTTED.fullmatch(word):
        return nxt.lower() in STARTERS[lang]  # "J. Smith" goes on; "at 5 p.m. He left" ends
    return True


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
