"""Hostile glossaries (service/text/glossary.py): mutated entry lists in DeepL's two formats parse or are
refused with a named code, and what parses is found and marked in texts of its own terms without
error; a seeded run here, a longer one in `make fuzz`."""

from __future__ import annotations

import random

from service.errors import ApiError
from service.text import glossary
from service.text.html_text import parse_documents
from service.text.protect import to_html

from .test_hostile_documents import FUZZ_CASES, FUZZ_SEED

NAMED = {"invalid_glossary", "glossary_too_large"}
VALID = {
    "tsv": "dog\tHund\nNew York\tNeu York\nbike\tVelo\n",
    "csv": 'dog,Hund\n"New, York",Neu York,en,de\nbike,Velo\n',
}
# What a mutation puts in: separators, quotes, control and format characters, a lone surrogate,
# combining marks, a character that folds to two, line breaks of other kinds, a long run.
PIECES = ["\t", ",", '"', "\n", "\r", "\x00", "\x07", "\u2028", "\ufeff", "\ud800", "\u0301", "ß", "İ", " ", "x" * 1100]


def mutations(seed: int, count: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        fmt = rng.choice(["tsv", "csv"])
        text = VALID[fmt]
        for _ in range(rng.randint(1, 6)):
            at = rng.randrange(len(text) + 1)
            kind = rng.randrange(3)
            if kind == 0:
                text = text[:at] + rng.choice(PIECES) + text[at:]
            elif kind == 1:
                text = text[:at] + text[at + rng.randint(1, 8) :]
            else:
                text = text[:at] + text[at : at + rng.randint(1, 20)] * rng.randint(2, 5) + text[at:]
        out.append((fmt, text))
    return out


def test_mutated_glossaries_parse_or_are_refused_by_name() -> None:
    for fmt, text in mutations(FUZZ_SEED, FUZZ_CASES):
        try:
            entries = glossary.parse_entries(text, fmt)
        except ApiError as exc:
            assert exc.code in NAMED, (fmt, text, exc.code, exc.detail)
            continue
        terms = glossary.Terms(entries)
        # Each source term in a sentence of its own, as text and as HTML: found, and marked in place.
        sentences = [f"A {source} runs." for source in entries]
        docs = parse_documents([to_html(s) for s in sentences])
        glossary.apply(docs, terms)
        for sentence in sentences:  # the term (or a longer one from there) is found where it stands
            assert terms.find(sentence)[0][0] == 2, (fmt, text, sentence)
