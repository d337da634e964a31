"""Glossaries: term pairs every translation must follow (DeepL's glossaries, `glossary` on /v1).

A glossary holds one or more dictionaries (DeepL's v3; a v2 glossary is one), each for a language pair in one
direction with at most MAX_ENTRIES entries; a translation uses its pair's dictionary. A source term is
found in a text as whole words (no match inside a longer word). The rules, in order:

- Case: a term written with a capital letter matches only as written ("Apple" the company, not
  "apple" the fruit); an all-lowercase term matches in any case, and where the text capitalises it
  (a sentence's first word) its target term is capitalised too.
- Overlaps: matches are taken leftmost first, the longest at a position ("New York City" before
  "New York"), and none overlaps another.
- Markup and do-not-translate spans win: a match that overlaps a span not to translate (a URL, a
  placeholder, translate="no", ignore_tags) or that crosses or encloses markup is not applied.

Each match becomes an inline element of its run (service/text/html_text.py) written as the target term:
the model still reads the source term in its sentence, and the word alignment puts the target term
where the source term's translation stands. The translation cache holds the model's translations,
which a glossary does not change, so one cache serves every glossary.
"""

from __future__ import annotations

import bisect
import csv
import hashlib
import html
import io
import json
import time
import unicodedata
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from service.errors import ApiError
from service.text.html_text import Element, HtmlDocument

MAX_ENTRIES = 10_000  # entries of one glossary
MAX_ENTRIES_CHARS = 1_000_000  # characters of one glossary's entries, as sent
MAX_TERM_CHARS = 1024  # one term (DeepL's limit, in characters here)
MAX_NAME_CHARS = 1024
MAX_GLOSSARIES = 1000  # glossaries of one API key
MAX_DICTIONARIES = 50  # dictionaries (language pairs) of one glossary
MAX_ALL_ENTRIES = 5 * MAX_ENTRIES  # entries of one glossary's dictionaries together
TERM_BYTES = 200  # the memory an entry of compiled Terms holds beside its characters
FORMATS = ("tsv", "csv")


@dataclass(frozen=True)
class Glossary:
    """A glossary as stored: its dictionaries (DeepL's v3 glossaries hold several, each for a language pair in
    one direction; a v2 glossary is one) and who owns it (the API key's client id)."""

    glossary_id: str
    name: str
    dictionaries: dict[str, dict[str, str]]  # "en-de" -> entries, in the order added
    owner: str
    created: float = field(default_factory=time.time)

    def dictionary(self, source: str, target: str) -> dict[str, str] | None:
        return self.dictionaries.get(f"{source}-{target}")

    def info(self) -> dict[str, Any]:
        """DeepL's v3 glossary object (GET /v3/glossaries/{id}): its dictionaries' pairs and sizes, no entries."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(self.created))
        return {
            "glossary_id": self.glossary_id,
            "name": self.name,
            "creation_time": f"{stamp}.{int(self.created % 1 * 1000):03d}Z",
            "dictionaries": [_dictionary_info(pair, entries) for pair, entries in self.dictionaries.items()],
        }

    def dumps(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def loads(cls, text: str | bytes) -> Glossary:
        """A stored glossary; one stored with a single pair's fields (source, target, entries) reads as one
        dictionary."""
        fields = json.loads(text)
        if "dictionaries" not in fields:
            fields["dictionaries"] = {f"{fields.pop('source')}-{fields.pop('target')}": fields.pop("entries")}
        return cls(**fields)


def _dictionary_info(pair: str, entries: dict[str, str]) -> dict[str, Any]:
    source, target = pair.split("-")
    return {"source_lang": source, "target_lang": target, "entry_count": len(entries)}


def v3_info(info: dict[str, Any]) -> dict[str, Any]:
    """A glossary's v3 object from a stored one of either version (a v2 object names one pair)."""
    if "dictionaries" in info:
        return info
    pair = f"{info['source_lang']}-{info['target_lang']}"
    return {
        "glossary_id": info["glossary_id"],
        "name": info["name"],
        "creation_time": info["creation_time"],
        "dictionaries": [{**_dictionary_info(pair, {}), "entry_count": info["entry_count"]}],
    }


def v2_info(info: dict[str, Any]) -> dict[str, Any] | None:
    """DeepL's v2 object of a glossary with one dictionary (GET /v2/glossaries/{id}: ready at once); None for one
    with several, which v2 cannot name."""
    info = v3_info(info)
    if len(info["dictionaries"]) != 1:
        return None
    (one,) = info["dictionaries"]
    return {
        "glossary_id": info["glossary_id"],
        "name": info["name"],
        "ready": True,
        "source_lang": one["source_lang"],
        "target_lang": one["target_lang"],
        "creation_time": info["creation_time"],
        "entry_count": one["entry_count"],
    }


def tsv(entries: dict[str, str]) -> str:
    return "".join(f"{s}\t{t}\n" for s, t in entries.items())


def checked_name(name: str) -> str:
    if not name.strip():
        raise ApiError("invalid_glossary", "the glossary's name is empty")
    _check_unicode(name, "the glossary's name")
    if len(name) > MAX_NAME_CHARS:
        raise ApiError("invalid_glossary", f"the glossary's name has {len(name)} characters; at most {MAX_NAME_CHARS}")
    return name


def checked_dictionaries(dictionaries: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """Each dictionary's entries checked (`checked`), and the glossary within MAX_DICTIONARIES and MAX_ALL_ENTRIES."""
    if not dictionaries:
        raise ApiError("invalid_glossary", "a glossary holds at least one dictionary")
    if len(dictionaries) > MAX_DICTIONARIES:
        raise ApiError(
            "invalid_glossary", f"{len(dictionaries)} dictionaries; a glossary holds at most {MAX_DICTIONARIES}"
        )
    total = sum(map(len, dictionaries.values()))
    if total > MAX_ALL_ENTRIES:
        raise ApiError("invalid_glossary", f"{total} entries in all; a glossary holds at most {MAX_ALL_ENTRIES}")
    return {pair: checked(entries) for pair, entries in dictionaries.items()}


def new_glossary(name: str, dictionaries: dict[str, dict[str, str]], owner: str) -> Glossary:
    return Glossary(str(uuid.uuid4()), checked_name(name), checked_dictionaries(dictionaries), owner)


# Characters that show nothing by themselves: format characters (ZWJ, a BOM), spaces, combining marks,
# controls. A term made of these alone would match where a reader sees no word.
INVISIBLE = {"Cf", "Zs", "Zl", "Zp", "Mn", "Me", "Cc"}


def _term(raw: str, where: str) -> str:
    """A term as stored and matched: stripped, in Unicode's composed form (NFC); ApiError for an empty, overlong
    or invisible term, or one holding a control character, a line break or a noncharacter (U+FFFF, ...)."""
    _check_unicode(raw, f"{where}: the term")
    term = unicodedata.normalize("NFC", raw.strip())
    if not term:
        raise ApiError("invalid_glossary", f"{where}: an empty term")
    if len(term) > MAX_TERM_CHARS:
        raise ApiError("invalid_glossary", f"{where}: a term of {len(term)} characters; at most {MAX_TERM_CHARS}")
    bad = next((c for c in term if unicodedata.category(c) in ("Cc", "Zl", "Zp")), None)
    if bad is not None:
        raise ApiError("invalid_glossary", f"{where}: the term {term[:40]!r} holds the control character {bad!r}")
    odd = next((c for c in term if 0xFDD0 <= ord(c) <= 0xFDEF or ord(c) & 0xFFFE == 0xFFFE), None)
    if odd is not None:
        raise ApiError("invalid_glossary", f"{where}: the term {term[:40]!r} holds the noncharacter U+{ord(odd):04X}")
    if all(unicodedata.category(c) in INVISIBLE for c in term):
        shown = " ".join(f"U+{ord(c):04X}" for c in term[:8])
        raise ApiError("invalid_glossary", f"{where}: the term ({shown}) has no visible character")
    return term


def _check_unicode(text: str, what: str) -> None:
    """ApiError naming the first lone surrogate (JSON's "\\ud800" reads as one): not valid Unicode, so it could
    be neither stored nor compared."""
    bad = next((i for i, c in enumerate(text) if "\ud800" <= c <= "\udfff"), None)
    if bad is not None:
        why = f"{what}: character {bad} is a lone surrogate U+{ord(text[bad]):04X}, not valid Unicode"
        raise ApiError("invalid_glossary", why)


def checked(entries: dict[str, str]) -> dict[str, str]:
    """The entries, their terms stripped and composed (NFC); ApiError when there are none, too many, or a term
    is empty, too long, invisible or holds a control character, a line break or a noncharacter."""
    return _entries(((f"entry {n}", s, t) for n, (s, t) in enumerate(entries.items(), 1)), len(entries))


def _entries(rows: Iterable[tuple[str, object, object]], count: int) -> dict[str, str]:
    """The one check of a glossary's entries, each row (where it is, source term, target term) named by
    where it is in what error it makes."""
    if not count:
        raise ApiError("invalid_glossary", "the glossary has no entries")
    if count > MAX_ENTRIES:
        raise ApiError("glossary_too_large", f"{count} entries; a glossary holds at most {MAX_ENTRIES}")
    out: dict[str, str] = {}
    for where, source, target in rows:
        if not isinstance(source, str) or not isinstance(target, str):
            raise ApiError("invalid_glossary", f"{where}: terms are strings")
        source, target = _term(source, where), _term(target, where)
        if source in out:
            raise ApiError("invalid_glossary", f"{where}: the source term {source[:40]!r} is listed twice")
        out[source] = target
    return out


def parse_entries(text: str, entries_format: str) -> dict[str, str]:
    """DeepL's entry formats: tsv (source<TAB>target per line) or csv (source,target[,source_lang,
    target_lang] per row); blank lines are skipped. ApiError naming the line otherwise."""
    if entries_format not in FORMATS:
        raise ApiError("invalid_glossary", f"entries_format must be tsv or csv, not {entries_format!r}")
    if len(text) > MAX_ENTRIES_CHARS:
        too_many = f"the entries have {len(text)} characters; a glossary holds at most {MAX_ENTRIES_CHARS}"
        raise ApiError("glossary_too_large", too_many)
    text = text.removeprefix("\ufeff")  # a file saved with a byte order mark: not part of its first term
    rows: list[tuple[int, list[str]]]
    if entries_format == "tsv":
        rows = [(n, line.split("\t")) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    else:
        try:
            rows = [(n, row) for n, row in enumerate(csv.reader(io.StringIO(text)), 1) if any(c.strip() for c in row)]
        except csv.Error as exc:
            raise ApiError("invalid_glossary", f"the CSV entries do not parse: {exc}") from None

    def shaped() -> Iterator[tuple[str, object, object]]:
        for n, row in rows:
            if len(row) not in ((2,) if entries_format == "tsv" else (2, 4)):
                want = "a source and a target term separated by a tab" if entries_format == "tsv" else "2 or 4 fields"
                raise ApiError("invalid_glossary", f"line {n}: {want}, not {len(row)} fields")
            yield f"line {n}", row[0], row[1]

    return _entries(shaped(), len(rows))


def digest(entries: dict[str, str]) -> str:
    """The entries' content, as a key: the same terms give the same digest whatever their order."""
    return hashlib.sha256(json.dumps(sorted(entries.items()), ensure_ascii=False).encode()).hexdigest()[:32]


Match = tuple[int, int, str]  # a source term's span in a text, and the target term written there


def _inside_word(text: str, at: int) -> bool:
    """Whether position `at` falls between two characters of one word."""
    return 0 < at < len(text) and text[at - 1].isalnum() and text[at].isalnum()


class Terms:
    """A glossary's entries, ready to find in texts."""

    def __init__(self, entries: dict[str, str]) -> None:
        # About the memory the compiled terms hold, their entries' strings included (tracemalloc: about 240
        # bytes an entry of 26 characters): what a cache of them counts.
        self.bytes = sum(TERM_BYTES + 2 * (len(s) + len(t)) for s, t in entries.items())
        self.exact = {s: t for s, t in entries.items() if s != s.lower()}  # has a capital: as written
        self.folded = {s.casefold(): (s, t) for s, t in entries.items() if s == s.lower()}
        # The lengths of the terms, longest first, by the first character of their folded form (a match's
        # first character folds to it): a position is tried at those lengths only.
        lengths: dict[str, set[int]] = {}
        for s in entries:
            lengths.setdefault(s.casefold()[:1], set()).add(len(s))
        self.lengths = {first: sorted(found, reverse=True) for first, found in lengths.items()}

    def find(self, text: str) -> list[Match]:
        """The matches in text, leftmost first, the longest at each position, none overlapping."""
        out: list[Match] = []
        at = 0
        while at < len(text):
            lengths = self.lengths.get(text[at].casefold()[:1])
            found = None if lengths is None or _inside_word(text, at) else self._at(text, at, lengths)
            if found is None:
                at += 1
                continue
            out.append(found)
            at = found[1]
        return out

    def _at(self, text: str, at: int, lengths: list[int]) -> Match | None:
        for n in lengths:
            end = at + n
            if end > len(text) or _inside_word(text, end):
                continue
            piece = text[at:end]
            if piece in self.exact:
                return at, end, self.exact[piece]
            if (hit := self.folded.get(piece.casefold())) is not None:
                source, target = hit
                if piece[0].isupper() and not source[0].isupper():  # capitalised in the text
                    target = target[0].upper() + target[1:]
                return at, end, target
        return None


def _applies(elements: list[Element], start: int, end: int) -> bool:
    """A match stays clear of markup: inside one element or none, enclosing none, and not on a span
    not to translate."""
    for e in elements:
        if e.verbatim is not None and e.start < end and start < e.end:
            return False  # a do-not-translate span wins
        if start < e.start < end or start < e.end < end:  # an edge, or an empty element, inside the term
            return False
        if e.start < e.end and start <= e.start and e.end <= end and (e.start, e.end) != (start, end):
            return False  # it encloses markup (an element of exactly its words holds it instead)
    return True


def apply(docs: list[HtmlDocument], terms: Terms) -> int:
    """Mark every match in the documents' runs as an element written as its target term; returns
    how many were marked."""
    marked = 0
    for doc in docs:
        for run in doc.runs:
            # Matches do not overlap: each is checked against the run's own markup, not the terms
            # marked before it (linear in the matches of a run of plain text).
            markup = list(run.elements)
            starts = [e.start for e in markup]  # in document order: never decreasing
            for start, end, target in terms.find(run.text):
                if not _applies(markup, start, end):
                    continue
                # After every element that starts at or before it: its parents, and what precedes it.
                at = bisect.bisect_right(starts, start)
                run.elements.insert(at, Element("", start, end, "", verbatim=[html.escape(target, quote=False)]))
                starts.insert(at, start)
                marked += 1
            for order, element in enumerate(run.elements):
                element.order = order
    return marked
