"""TMX 1.4 (the localisation industry's translation-memory exchange format) read into a language pair's
units and written back.

A `<tu>` gives a unit when it has a `<tuv>` in each language of the pair (matched on the primary subtag:
`en-US` is `en`, the attribute `xml:lang` or TMX 1.1's `lang`); a `<seg>`'s text is its characters and
those of its `<hi>` and `<sub>` elements, without the native codes of `<bpt>`, `<ept>`, `<it>`, `<ph>`
and `<ut>`. Units with an empty side are skipped; a unit repeated keeps its last translation, as a
memory updated in place does. The file is parsed by service/text/ooxml_text.parse_bounded: no DTD,
no entities, the elements counted as they are read.
"""

from __future__ import annotations

import datetime
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from service.errors import ApiError
from service.text.ooxml_text import parse_bounded

MAX_UNITS = 200_000  # units of one memory
MAX_ELEMENTS = MAX_UNITS * 16  # a file's XML elements: each unit's tu, tuv, seg, prop, note and inline codes
XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
CODES = {"bpt", "ept", "it", "ph", "ut"}  # inline native codes: markup of the file's own format, not text


def read(data: bytes, source: str, target: str) -> dict[str, str]:
    """The file's units for the pair as {source segment: target segment}; ApiError invalid_memory where
    the file is not TMX or holds no unit for the pair (an empty memory would answer nothing), memory_too_large
    past MAX_UNITS."""
    try:
        root = parse_bounded("TMX", "", data, [MAX_ELEMENTS])
    except ApiError as exc:  # parse_bounded's words are a document's: the limit here is the TMX file's
        if exc.code == "document_too_large":
            raise ApiError("memory_too_large", f"the TMX file holds more than {MAX_ELEMENTS:,} XML elements") from None
        raise ApiError("invalid_memory", exc.detail) from None
    body = _child(root, "body") if _local(root.tag) == "tmx" else None
    if body is None:
        raise ApiError("invalid_memory", "the file is not TMX: its root is not <tmx> with a <body>")
    units: dict[str, str] = {}
    seen: set[str] = set()  # the languages of the file's segments, to say what it holds
    for tu in body:
        if _local(tu.tag) != "tu":
            continue
        sides = {}
        for tuv in tu:
            if _local(tuv.tag) != "tuv":
                continue
            lang = (tuv.get(XML_LANG) or tuv.get("lang") or "").split("-")[0].split("_")[0].lower()
            seg = _child(tuv, "seg")
            if len(seen) < 64:
                seen.add(lang or "none named")
            if lang in (source, target) and seg is not None:
                sides[lang] = " ".join(_text(seg).split())
        if sides.get(source) and sides.get(target):
            units[sides[source]] = sides[target]
            if len(units) > MAX_UNITS:
                raise ApiError("memory_too_large", f"the file holds more than {MAX_UNITS} units for {source}-{target}")
    if not units:
        held = ", ".join(sorted(seen)[:10]) or "no segments"
        raise ApiError(
            "invalid_memory",
            f"the file holds no unit with both a {source} and a {target} segment (its languages: {held})",
        )
    return units


def write(units: dict[str, str], source: str, target: str) -> bytes:
    """The units as a TMX 1.4 file, one <tu> each, in their order."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    head = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<tmx version="1.4">\n'
        f'<header creationtool="beamserve" creationtoolversion="1" segtype="sentence" o-tmf="beamserve"'
        f' adminlang="en" srclang={quoteattr(source)} datatype="plaintext" creationdate="{now}"/>\n<body>\n'
    )
    body = "".join(
        f"<tu><tuv xml:lang={quoteattr(source)}><seg>{escape(s)}</seg></tuv>"
        f"<tuv xml:lang={quoteattr(target)}><seg>{escape(t)}</seg></tuv></tu>\n"
        for s, t in units.items()
    )
    return (head + body + "</body>\n</tmx>\n").encode()


def _local(tag: Any) -> str:
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def _child(element: Any, name: str) -> Any:
    return next((c for c in element if _local(c.tag) == name), None)


def _text(seg: Any) -> str:
    """A segment's text: its own characters and its inline elements', but the native codes'."""
    out = [seg.text or ""]
    for child in seg:
        if _local(child.tag) not in CODES:
            out.append(_text(child))
        out.append(child.tail or "")
    return "".join(out)
