"""XLIFF files (.xlf, .xliff; versions 1.2 and 2.x), the localisation industry's exchange format: each source
segment as an HTML fragment, and the file rebuilt with each translation as the segment's target.

A segment's inline codes are its markup: an element that holds text to translate (1.2's <g> and <mrk>, 2.x's
<pc> and <mrk>) is a <span data-x="i"> around its text, so the word alignment carries it over to the words it
covers (service/text/html_text.py); one that does not (<x/>, <ph>, <bpt>, <ept>, <it>, <bx/>, <ex/>, <sc/>,
<ec/>, <sm/>, <em/>, <cp/>, and comments) is an <img data-x="i">, written back as it came, native code and all.

Translated: every segment (1.2: <trans-unit>; 2.x: each <segment> of a <unit>) whose source has words and whose
target is missing or blank, outside a unit or file marked translate="no". A target with words (a person's
translation, a memory's) is kept; the new ones are marked state="translated" (1.2 on the target, 2.x on the
segment). Everything else (notes, metadata, <ignorable>, the file's own markup) stays as it came.
"""

from __future__ import annotations

from typing import Any

from lxml import etree

from service.errors import ApiError
from service.text.inline_xml import InlineXml, local_name, top_down
from service.text.ooxml_text import MAX_ELEMENTS, MAX_XML_BYTES, parse_bounded
from service.text.parsed import Parsed

V12 = "{urn:oasis:names:tc:xliff:document:1.2}"
V2 = "{urn:oasis:names:tc:xliff:document:2.0}"
TEXT_CODES = {"g", "mrk", "pc"}  # inline elements whose content is text to translate


class _Segment:
    """One segment's source as an HTML fragment, and its target built from a translation."""

    def __init__(self, holder: Any, source: Any, target: Any, ns: str) -> None:
        self.holder, self.source, self.target, self.ns = holder, source, target, ns
        self.inline = InlineXml(source, lambda e: local_name(e) in TEXT_CODES)
        self.fragment = self.inline.fragment

    def write(self, translated: str) -> None:
        """The translation as the segment's target (in place of a blank one, or after the source)."""
        target = etree.Element(f"{self.ns}target", attrib=dict(self.target.attrib) if self.target is not None else {})
        self.inline.fill(target, translated)
        if self.ns == V12:
            target.set("state", "translated")
        else:
            self.holder.set("state", "translated")
        if self.target is not None:
            target.tail = self.target.tail
            self.holder.replace(self.target, target)
        else:
            target.tail = self.source.tail
            self.source.addnext(target)


def _words(element: Any) -> bool:
    return element is not None and bool("".join(element.itertext()).strip())


def _segments(root: Any) -> list[_Segment]:
    if root.tag == f"{V12}xliff":
        ns, tag = V12, f"{V12}trans-unit"
    elif root.tag == f"{V2}xliff":
        ns, tag = V2, f"{V2}segment"  # each unit's segments; <ignorable> is not one
    else:
        raise ApiError("invalid_document", "not an XLIFF file: its root is not <xliff> of version 1.2 or 2.x")
    found = []
    # translate="no" on an element holds for everything in it: passed down, not looked up the ancestors.
    for holder, off in top_down(root, False, lambda e, off: off or e.get("translate") == "no"):
        if holder.tag != tag or off:
            continue
        source, target = holder.find(f"{ns}source"), holder.find(f"{ns}target")
        if _words(source) and not _words(target):
            found.append(_Segment(holder, source, target, ns))
    return found


def xliff_document(data: bytes) -> Parsed:
    """An XLIFF file as segments; ApiError invalid_document for one that is not XLIFF or does not parse,
    document_too_large past ooxml_text's MAX_XML_BYTES or MAX_ELEMENTS."""
    if len(data) > MAX_XML_BYTES:
        raise ApiError("document_too_large", f"{len(data)} bytes of XML; a document holds at most {MAX_XML_BYTES}")

    def read() -> tuple[Any, list[_Segment]]:
        root = parse_bounded("xliff", "", data, [MAX_ELEMENTS])
        return root, _segments(root)

    _, segments = read()

    def rebuild(translations: list[str]) -> bytes:
        root, found = read()  # afresh: the same segments, in the same order
        for segment, translated in zip(found, translations, strict=True):
            segment.write(translated)
        out: bytes = etree.tostring(root.getroottree(), xml_declaration=True, encoding="UTF-8")
        return out

    return Parsed([s.fragment for s in segments], True, rebuild)
