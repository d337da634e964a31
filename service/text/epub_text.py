"""EPUB books (.epub) for translation: each XHTML content document of the book, in its reading order (the
package's spine, then the other XHTML documents of its manifest, such as the table of contents), read as an
HTML document (service/text/documents.py's HTML: each run of prose a segment, inline markup carried over),
and the book rebuilt with every other member of its zip (the mimetype first and stored, styles, pictures,
fonts, the package document) byte for byte as it came.
"""

from __future__ import annotations

import io
import posixpath
import zipfile

from service.errors import ApiError
from service.text.html_text import HtmlDocument, HtmlLimitError, HtmlSyntaxError
from service.text.ooxml_text import MAX_ELEMENTS, MAX_XML_BYTES, check_members, parse_bounded, rezipped, zip_member
from service.text.parsed import Parsed

CONTAINER = "META-INF/container.xml"
OCF = "{urn:oasis:names:tc:opendocument:xmlns:container}"
OPF = "{http://www.idpf.org/2007/opf}"
XHTML = {"application/xhtml+xml", "text/html"}


def _documents(z: zipfile.ZipFile) -> list[str]:
    """The book's XHTML documents, in reading order: ApiError invalid_document for a zip that is not an EPUB."""
    names = set(z.namelist())
    if CONTAINER not in names:
        raise ApiError("invalid_document", f"not an EPUB book: it has no {CONTAINER}")
    budget = [MAX_ELEMENTS]
    rootfile = parse_bounded("epub", CONTAINER, zip_member("epub", z, CONTAINER), budget).find(f".//{OCF}rootfile")
    package_path = rootfile.get("full-path") if rootfile is not None else None
    if not package_path or package_path not in names:
        raise ApiError("invalid_document", "not an EPUB book: its container names no package document it holds")
    package = parse_bounded("epub", package_path, zip_member("epub", z, package_path), budget)
    base = posixpath.dirname(package_path)
    items: dict[str, str] = {}
    for item in package.iter(f"{OPF}item"):
        href, kind = item.get("href"), item.get("media-type")
        if href and kind in XHTML:
            path = posixpath.normpath(posixpath.join(base, href.split("#")[0]))
            if path in names:
                items[item.get("id") or path] = path
    spine = [items[ref.get("idref", "")] for ref in package.iter(f"{OPF}itemref") if ref.get("idref") in items]
    return list(dict.fromkeys([*spine, *items.values()]))


def epub_document(data: bytes) -> Parsed:
    """An .epub file (its zip already checked: documents.unzipped_safely) as segments; ApiError invalid_document
    for a file that is not an EPUB or a content document that is not UTF-8 or not readable HTML,
    document_too_large past ooxml_text's MAX_XML_BYTES of content documents or its MAX_ELEMENTS tags in them all
    (each document's own bound, html_text's, is a hundredth of that)."""
    try:
        z = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError) as exc:
        raise ApiError("invalid_document", f"the epub file's zip does not read ({exc})") from None
    paths = _documents(z)
    size = sum(z.getinfo(p).file_size for p in paths)
    if size > MAX_XML_BYTES:
        raise ApiError(
            "document_too_large", f"its content documents unpack to {size} bytes; a book holds at most {MAX_XML_BYTES}"
        )
    books: list[tuple[str, HtmlDocument]] = []
    tags = 0
    for path in paths:
        raw = zip_member("epub", z, path)
        try:
            doc = HtmlDocument(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            why = f"the epub file's {path[:200]!r} is not UTF-8 (byte {exc.start})"
            raise ApiError("invalid_document", why) from None
        except (HtmlLimitError, HtmlSyntaxError) as exc:
            raise ApiError("invalid_document", f"the epub file's {path[:200]!r}: {exc}") from None
        books.append((path, doc))
        tags += doc.tags
        if tags > MAX_ELEMENTS:
            raise ApiError(
                "document_too_large",
                f"its content documents hold more than {MAX_ELEMENTS} tags; a book holds at most that",
            )
    check_members("epub", z, read=paths)
    segments = ["".join(run.original) for _, doc in books for run in doc.runs]

    def rebuild(translations: list[str]) -> bytes:
        written: dict[str, bytes] = {}
        at = 0
        for path, doc in books:
            written[path] = doc.with_fragments(translations[at : at + len(doc.runs)]).encode()
            at += len(doc.runs)
        return rezipped("epub", z, written)

    return Parsed(segments, True, rebuild)
