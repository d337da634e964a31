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
- a CJK full stop, exclamation or question mark (。！？ and their half-width and vertical forms), or
  any other script's sentence terminal (Unicode's Sentence_Terminal: the Devanagari danda ।, Arabic
  ؟ and ۔, Armenian ։, Ethiopic ።, Myanmar ။, Khmer ។, ...), with or without whitespace after it;
- in a run of Thai or Lao, which mark no sentence end, a space before MAX_UNMARKED characters have
  gone by without a boundary (a dictionary-free bound: the models take sentences, and a paragraph as
  one sentence loses all but its first).

Per source language (en, de, fr; others get the union of their lists). One pass over the text: each
candidate looks back at most LOOKBACK characters, so splitting is linear in the text's length.
"""

from __future__ import annotations

import re
from typing import TypeVar

T = TypeVar("T")
LOOKBACK = 48  # characters looked back from a full stop for the word it ends
MAX_UNMARKED = 200  # characters of Thai or Lao between cuts at spaces

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
# The ends of sentences (Unicode 17's Sentence_Terminal; tests/test_sentences.py holds them to the `regex`
# package's list): those of Latin script, whose end is read with the next word; CJK's; and every other
# script's, which end a sentence whatever follows. Not the Myanmar little section (U+104A, a comma in
# use) nor the one-dot leader (U+2024).
LATIN_STOPS = ".!?\u2026\u203c\u203d\u2047-\u2049"
CJK_STOPS = "\u3002\uff01\uff1f\uff61\uff0e\ufe12\ufe15\ufe16\ufe52\ufe56\ufe57"
OTHER_STOPS = (
    "\u0589\u061d-\u061f\u06d4\u0700-\u0702\u07f9\u0837\u0839\u083d\u083e\u0964\u0965\u104b\u1362\u1367\u1368"
    "\u166e\u1735\u1736\u17d4\u17d5\u1803\u1809\u1944\u1945\u1aa8-\u1aab\u1b4e\u1b4f\u1b5a\u1b5b\u1b5e\u1b5f"
    "\u1b7d-\u1b7f\u1c3b\u1c3c\u1c7e\u1c7f\u2cf9-\u2cfb\u2e2e\u2e3c\u2e53\u2e54\u2e60\u2e61\ua4ff\ua60e\ua60f"
    "\ua6f3\ua6f7\ua876\ua877\ua8ce\ua8cf\ua92f\ua9c8\ua9c9\uaa5d-\uaa5f\uaaf0\uaaf1\uabeb\U00010a56\U00010a57"
    "\U00010f55-\U00010f59\U00010f86-\U00010f89\U00011047\U00011048\U000110be-\U000110c1\U00011141-\U00011143"
    "\U000111c5\U000111c6\U000111cd\U000111de\U000111df\U00011238\U00011239\U0001123b\U0001123c\U000112a9"
    "\U000113d4\U000113d5\U0001144b\U0001144c\U000115c2\U000115c3\U000115c9-\U000115d7\U00011641\U00011642"
    "\U0001173c-\U0001173e\U00011944\U00011946\U00011a42\U00011a43\U00011a9b\U00011a9c\U00011c41\U00011c42"
    "\U00011ef7\U00011ef8\U00011f43\U00011f44\U00016a6e\U00016a6f\U00016af5\U00016b37\U00016b38\U00016b44"
    "\U00016d6e\U00016d6f\U00016e98\U0001bc9f\U0001da88"
)
_BOUNDARY = re.compile(
    # French sets a space before ! ? and a closing guillemet: "Viens ! » Elle".
    rf"(?P<stop>[{LATIN_STOPS}]+)(?:[^\S\n]?[{_C}])*(?P<ws>\s+)(?=[{_O}]*(?P<next>\w+))"
    rf"|(?P<cjk>[{CJK_STOPS}{OTHER_STOPS}]+[\u300d\u300f{_C}\uff09]*)(?P<cjk_ws>[^\S\n]*)(?=\S)"
    r"|(?P<line>[^\S\n]*\n\s*)"
)
# Every boundary starts with one of these before the body's last character: a body without one is a sentence.
_MAY_CUT = re.compile(rf"[{LATIN_STOPS}{CJK_STOPS}{OTHER_STOPS}\n]")
_UNMARKED = re.compile(r"[\u0e01-\u0e5b\u0e81-\u0edf]")  # Thai and Lao letters
_NUMBER = re.compile(r"[\d.,]*\d")
_DOTTED = re.compile(r"(?:[^\W\d_]\.)+[^\W\d_]?")  # U.S, e.g, p.m, E.S.E


def split_sentences(text: str, lang: str = "") -> tuple[list[str], list[str]]:
    """text -> (sentences, separators) with text == s[0] + sep[0] + s[1] + ... + s[-1].

    lang: the source language's code (en, de, fr; another or "" uses every list). A text without a
    boundary (or a blank one) comes back whole, as one sentence. The text's leading and trailing
    whitespace stay on its first and last sentences (a tokenizer ignores them).
    """
    body = text.strip()
    if _MAY_CUT.search(body, 0, len(body) - 1) is None and not _long_unmarked(body):
        return [text], []
    lang = lang if lang in STARTERS else ""
    sentences: list[str] = []
    separators: list[str] = []
    start = 0
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
        _append(sentences, separators, body[start:end])
        separators.append(body[end:nxt])
        start = nxt
    _append(sentences, separators, body[start:])
    lead = text[: len(text) - len(text.lstrip())]
    sentences[0] = lead + sentences[0]
    sentences[-1] += text[len(lead) + len(body) :]
    return sentences, separators


def _long_unmarked(sentence: str) -> bool:
    return len(sentence) > MAX_UNMARKED and _UNMARKED.search(sentence) is not None


def _append(sentences: list[str], separators: list[str], sentence: str) -> None:
    """`sentence` added, in pieces cut at spaces where it is a long run of a script without sentence marks
    (each piece at most MAX_UNMARKED characters where a space allows)."""
    while _long_unmarked(sentence):
        cut = sentence.rfind(" ", 1, MAX_UNMARKED + 1)
        if cut <= 0:
            cut = sentence.find(" ", MAX_UNMARKED)
            if cut <= 0:
                break
        end = cut
        while end < len(sentence) and sentence[end] == " ":
            end += 1
        if end >= len(sentence):
            break
        sentences.append(sentence[:cut])
        separators.append(sentence[cut:end])
        sentence = sentence[end:]
    sentences.append(sentence)


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
