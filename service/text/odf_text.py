"""OpenDocument files (.odt, .odp, .ods: LibreOffice's, and what most office suites also write) for
translation, at their XML (lxml): each paragraph and heading (<text:p>, <text:h>) of content.xml and
styles.xml (a text's headers and footers) as an HTML fragment, and the file rebuilt with every other
member of its zip byte for byte as it came.

A paragraph's spans and links (<text:span>, <text:a>) hold text: their styles carried over by the word
alignment (service/text/inline_xml.py). What sits among the text and is not text (spaces and tabs written as
elements, line breaks, fields, bookmarks, pictures, notes) is kept in place; a note's or a frame's own
paragraphs are translated as paragraphs of their own. A spreadsheet cell that holds a number, a date, a
currency or a percentage is not translated, as Excel's numbers are not.
"""

from __future__ import annotations

import io
import zipfile
from typing import Any

from lxml import etree

from service.errors import ApiError
from service.text.inline_xml import InlineXml, top_down
from service.text.ooxml_text import MAX_ELEMENTS, MAX_XML_BYTES, check_members, parse_bounded, rezipped, zip_member
from service.text.parsed import Parsed

TEXT = "{urn:oasis:names:tc:opendocument:xmlns:text:1.0}"
TABLE = "{urn:oasis:names:tc:opendocument:xmlns:table:1.0}"
OFFICE = "{urn:oasis:names:tc:opendocument:xmlns:office:1.0}"
PARAGRAPHS = (f"{TEXT}p", f"{TEXT}h")
HOLDS_TEXT = {f"{TEXT}span", f"{TEXT}a"}
PARTS = ("content.xml", "styles.xml")  # in the order read
KINDS = {
    "odt": "application/vnd.oasis.opendocument.text",
    "odp": "application/vnd.oasis.opendocument.presentation",
    "ods": "application/vnd.oasis.opendocument.spreadsheet",
}


def _paragraphs(root: Any) -> list[Any]:
    """The paragraphs to translate: those with words, outside a cell whose value is not a string (the nearest
    cell passed down the tree, not looked up each paragraph's ancestors)."""
    found = []
    nearest: Any = None  # the cell a paragraph is in
    for p, cell in top_down(root, nearest, lambda e, cell: e if e.tag == f"{TABLE}table-cell" else cell):
        words = p.tag in PARAGRAPHS and "".join(_own_text(p)).strip()
        if words and (cell is None or cell.get(f"{OFFICE}value-type", "string") == "string"):
            found.append(p)
    return found


def _holds_text(element: Any) -> bool:
    return element.tag in HOLDS_TEXT


def _own_text(element: Any) -> list[str]:
    """The element's text, its spans' and links' included, not that of paragraphs nested in it (a note's)."""
    out = [element.text or ""]
    for child in element:
        if child.tag in HOLDS_TEXT:
            out += _own_text(child)
        out.append(child.tail or "")
    return out


def odf_document(kind: str, data: bytes) -> Parsed:
    """An .odt, .odp or .ods file (its zip already checked: documents.unzipped_safely) as segments; ApiError
    invalid_document for a file that is not the format or does not read whole, document_too_large past
    ooxml_text's MAX_XML_BYTES or MAX_ELEMENTS."""

    def read() -> tuple[zipfile.ZipFile, dict[str, Any], list[Any]]:
        try:
            z = zipfile.ZipFile(io.BytesIO(data))
            names = z.namelist()
        except (zipfile.BadZipFile, ValueError) as exc:
            raise ApiError("invalid_document", f"the {kind} file's zip does not read ({exc})") from None
        mimetype = zip_member(kind, z, "mimetype").decode("ascii", "replace").strip() if "mimetype" in names else ""
        if mimetype != KINDS[kind] or "content.xml" not in names:
            raise ApiError("invalid_document", f"not an OpenDocument .{kind} file: its mimetype is not {KINDS[kind]}")
        parts = [n for n in PARTS if n in names]
        size = sum(z.getinfo(n).file_size for n in parts)
        if size > MAX_XML_BYTES:
            why = f"its text parts unpack to {size} bytes of XML; a document holds at most {MAX_XML_BYTES}"
            raise ApiError("document_too_large", why)
        budget = [MAX_ELEMENTS]
        trees = {n: parse_bounded(kind, n, zip_member(kind, z, n), budget) for n in parts}
        paragraphs = [p for n in parts for p in _paragraphs(trees[n])]
        return z, trees, paragraphs

    z, trees, paragraphs = read()
    check_members(kind, z, read=trees)
    segments = [InlineXml(p, _holds_text).fragment for p in paragraphs]

    def rebuild(translations: list[str]) -> bytes:
        z, trees, found = read()  # afresh: the same paragraphs, in the same order
        inline = [InlineXml(p, _holds_text) for p in found]  # each paragraph's pieces before any is rewritten
        # The last first: a paragraph nested in a note is written before the paragraph that holds the note
        # copies it.
        for p, pieces, translated in reversed(list(zip(found, inline, translations, strict=True))):
            if not translated:
                continue
            for child in list(p):
                p.remove(child)
            p.text = None
            pieces.fill(p, translated)
        return rezipped(
            kind, z, {n: etree.tostring(t, xml_declaration=True, encoding="UTF-8") for n, t in trees.items()}
        )

    return Parsed(segments, True, rebuild)
