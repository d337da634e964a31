"""Office documents (.docx, .pptx, .xlsx) for translation, at their XML (lxml): each paragraph as an HTML
fragment whose inline markup is its runs' formatting, and the file rebuilt around the translations
with every other part of its zip byte for byte as it came.

A paragraph's runs in its most common formatting (by characters) are its plain text; every other run
is a <span data-r="i">, and a Word hyperlink an <a data-h="j"> around its runs, so the word alignment
carries them over to the words they cover (service/text/html_text.py). What sits among the runs and is
not text (a picture, a field, a slide's line break) is an <img data-r="i"> kept in place and written
back as it came. In the rebuilt paragraph each piece of text is a copy of its run with the new text
(the plain text a copy of a run in the common formatting); the paragraph's properties and anything
that is not one of its runs stay where they were.

- Word: the paragraphs of the body (tables' cells included), headers, footers, footnotes and endnotes.
- PowerPoint: the paragraphs of every slide's shapes and tables, and of the speaker notes.
- Excel: the workbook's shared strings and cells' own strings (every text cell), rich text runs
  included. Numbers, formulas, sheet names and comments are not translated.
"""

from __future__ import annotations

import copy
import html
import io
import re
import zipfile
import zlib
from collections import Counter
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from lxml import etree

from service.errors import ApiError
from service.text.html_text import TAG
from service.text.parsed import Parsed

W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
A = "{http://schemas.openxmlformats.org/drawingml/2006/main}"
S = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"
_TOKEN = re.compile(r"<(/?)(span|a|img)(?: data-[rh]=\"(\d+)\")?\s*/?>|([^<]+)")


@dataclass(frozen=True)
class Dialect:
    """Where a format keeps its paragraphs and how it writes them."""

    name: str  # what the format is, for a person
    main: str  # the member every file of the format has
    parts: tuple[str, ...]  # the zip members that hold text (regular expressions), in the order read
    paragraph: tuple[str, ...]  # the elements that are paragraphs
    run: str
    text: str
    props: str
    link: str | None = None  # an element around runs (a Word hyperlink)
    inline: tuple[str, ...] = ()  # elements among the runs that are not text, kept in place
    characters: tuple[tuple[str, str], ...] = ()  # elements inside a run that are characters: (tag, char)


DIALECTS = {
    "docx": Dialect(
        "a Word document",
        "word/document.xml",
        (r"word/document\.xml", r"word/header\d*\.xml", r"word/footer\d*\.xml", r"word/(foot|end)notes\.xml"),
        (W + "p",),
        W + "r",
        W + "t",
        W + "rPr",
        link=W + "hyperlink",
        characters=((W + "tab", "\t"), (W + "br", "\n")),
    ),
    "pptx": Dialect(
        "a PowerPoint presentation",
        "ppt/presentation.xml",
        (r"ppt/slides/slide\d+\.xml", r"ppt/notesSlides/notesSlide\d+\.xml"),
        (A + "p",),
        A + "r",
        A + "t",
        A + "rPr",
        inline=(A + "br", A + "fld"),
    ),
    "xlsx": Dialect(
        "an Excel workbook",
        "xl/workbook.xml",
        (r"xl/sharedStrings\.xml", r"xl/worksheets/sheet\d+\.xml"),
        (S + "si", S + "is"),  # a shared string (as Excel writes text), a cell's own (as openpyxl does)
        S + "r",
        S + "t",
        S + "rPr",
    ),
}


class _Paragraph:
    """One paragraph's runs as an HTML fragment, and the paragraph rebuilt from its translation."""

    def __init__(self, p: Any, d: Dialect) -> None:
        self.p, self.d = p, d
        kinds = (d.run, *([d.link] if d.link else []), *d.inline)
        self.content = [c for c in p if c.tag in kinds]
        self.runs: list[Any] = []  # runs and inline elements, links' runs in their place
        self.links: list[Any] = []
        for c in self.content:
            if c.tag == d.link:
                self.links.append(c)
                self.runs += [r for r in c if r.tag == d.run]
            else:
                self.runs.append(c)
        # Each run's and link's place, by identity: a paragraph may hold 100,000s of runs (list.index would
        # make its fragment quadratic in them).
        self.run_at = {id(r): i for i, r in enumerate(self.runs)}
        self.link_at = {id(link): j for j, link in enumerate(self.links)}
        shares: Counter[bytes] = Counter()
        for run in self.runs:
            if self._plain(run):
                shares[self._formatting(run)] += len(self._text(run))
        self.common = shares.most_common(1)[0][0] if shares else b""
        self.direct = p.find(d.text) if not self.content else None  # Excel's unformatted string: <si><t>
        self.text = (self.direct.text or "") if self.direct is not None else "".join(map(self._text, self.runs))

    def _plain(self, run: Any) -> bool:
        allowed = {self.d.props, self.d.text, *(tag for tag, _ in self.d.characters)}
        return run.tag == self.d.run and all(child.tag in allowed for child in run)

    def _text(self, run: Any) -> str:
        if not self._plain(run):
            return ""
        chars = dict(self.d.characters)
        return "".join((c.text or "") if c.tag == self.d.text else chars.get(c.tag, "") for c in run)

    def _formatting(self, run: Any) -> bytes:
        props = run.find(self.d.props)
        return etree.tostring(props) if props is not None else b""

    def fragment(self) -> str:
        if self.direct is not None:
            return html.escape(self.text, quote=False)
        out = []
        for c in self.content:
            if c.tag == self.d.link:
                inner = "".join(self._run(r) for r in c if r.tag == self.d.run)
                out.append(f'<a data-h="{self.link_at[id(c)]}">{inner}</a>')
            else:
                out.append(self._run(c))
        return "".join(out)

    def _run(self, run: Any) -> str:
        i = self.run_at[id(run)]
        if not self._plain(run):
            return f'<img data-r="{i}">'
        text = html.escape(self._text(run), quote=False)
        return text if self._formatting(run) == self.common else f'<span data-r="{i}">{text}</span>'

    def rebuild(self, translated: str) -> None:
        """The paragraph's runs replaced by the translation's pieces, in its order."""
        if self.direct is not None:
            self._set_text(self.direct, html.unescape(TAG.sub("", translated)))
            return
        plain = next((r for r in self.runs if self._plain(r) and self._formatting(r) == self.common), None)
        built: list[Any] = []
        link: Any = None
        span: int | None = None
        for m in _TOKEN.finditer(translated):
            closing, tag, number, text = m.groups()
            into = link if link is not None else built
            if text is not None:
                into.append(self._with_text(self.runs[span] if span is not None else plain, html.unescape(text)))
            elif tag == "img" and number is not None:
                into.append(self.runs[int(number)])  # as it came
            elif tag == "span":
                span = None if closing or number is None else int(number)
            elif tag == "a":
                link = None
                if not closing and number is not None:
                    link = copy.deepcopy(self.links[int(number)])
                    for child in [c for c in link if c.tag == self.d.run]:
                        link.remove(child)
                    built.append(link)
        # The children anew in one assignment (removing and inserting each would be quadratic in the runs):
        # the built ones where the first run was, everything that was not a run where it was.
        content = {id(c) for c in self.content}
        children = list(self.p)
        at = next(i for i, c in enumerate(children) if id(c) in content)
        kept = [c for c in children if id(c) not in content]
        before = sum(1 for c in children[:at] if id(c) not in content)
        self.p[:] = kept[:before] + built + kept[before:]

    def _with_text(self, template: Any, text: str) -> Any:
        """A copy of a run (a new plain run without one) holding `text`, its tabs and line breaks as
        the format writes them."""
        run = copy.deepcopy(template) if template is not None else etree.Element(self.d.run)
        for child in [c for c in run if c.tag != self.d.props]:
            run.remove(child)
        by_char = {char: tag for tag, char in self.d.characters}
        for k, piece in enumerate(re.split(r"(\t|\n)", text)):
            if k % 2 and piece in by_char:
                etree.SubElement(run, by_char[piece])
            elif piece:
                self._set_text(etree.SubElement(run, self.d.text), piece)
        return run

    @staticmethod
    def _set_text(t: Any, text: str) -> None:
        t.text = text
        if text != text.strip():
            t.set(XML_SPACE, "preserve")


def _paragraphs(parts: dict[str, Any], d: Dialect) -> list[_Paragraph]:
    ordered = sorted(parts, key=lambda n: _order(n, d) or (0, []))
    found = [_Paragraph(p, d) for name in ordered for p in parts[name].iter(*d.paragraph)]
    return [p for p in found if p.text.strip()]


def _order(name: str, d: Dialect) -> tuple[int, list[Any]] | None:
    """A part's place (the body before headers, slides before notes, slide2 before slide10); None for a
    part without text to translate."""
    group = next((i for i, pattern in enumerate(d.parts) if re.fullmatch(pattern, name)), None)
    return None if group is None else (group, [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)])


# What the text parts of one document may hold: their XML unpacked, and their elements parsed (an lxml element
# costs about 150 bytes of memory; a 500,000-character document takes some 30,000). A file past either is
# refused as too large as soon as it is known, before memory grows: from the zip's directory for the bytes,
# while parsing for the elements.
MAX_XML_BYTES = 32_000_000
MAX_ELEMENTS = 500_000
# Every error the zip module, zlib and the XML parser raise on a malformed file.
# The compression methods a member may use: stored and deflated, what Office, OpenDocument and EPUB files are
# written with. A deflated member is inflated READ_PIECE at a time.
MEMBER_METHODS = frozenset({zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED})
READ_PIECE = 1 << 16
_UNREADABLE = (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, RuntimeError, zlib.error, EOFError,
               OSError, ValueError, UnicodeDecodeError)  # fmt: skip


def office_document(kind: str, data: bytes) -> Parsed:
    """A .docx, .pptx or .xlsx file (its zip already checked: documents.unzipped_safely) as segments. ApiError
    invalid_document for a file that is not the format or does not read whole (a member the zip module cannot
    unpack: an unknown compression method, encryption, a wrong CRC-32, a corrupt stream, overlapping members;
    XML that does not parse), document_too_large past MAX_XML_BYTES or MAX_ELEMENTS."""
    d = DIALECTS[kind]

    def read() -> tuple[zipfile.ZipFile, dict[str, Any]]:
        try:
            z = zipfile.ZipFile(io.BytesIO(data))
            names = z.namelist()
        except _UNREADABLE as exc:
            raise ApiError("invalid_document", f"the {kind} file's zip does not read ({_why(exc)})") from None
        if d.main not in names:
            raise ApiError("invalid_document", f"not {d.name}: it has no {d.main}")
        texts = [n for n in names if _order(n, d) is not None]
        size = sum(z.getinfo(n).file_size for n in texts)
        if size > MAX_XML_BYTES:
            raise ApiError(
                "document_too_large",
                f"its text parts unpack to {size} bytes of XML; a document holds at most {MAX_XML_BYTES}",
            )
        budget = [MAX_ELEMENTS]
        return z, {n: parse_bounded(kind, n, zip_member(kind, z, n), budget) for n in texts}

    z, parts = read()
    check_members(kind, z, read=parts)
    segments = [p.fragment() for p in _paragraphs(parts, d)]

    def rebuild(translations: list[str]) -> bytes:
        z, parts = read()  # afresh: the same paragraphs, in the same order
        for paragraph, translated in zip(_paragraphs(parts, d), translations, strict=True):
            paragraph.rebuild(translated)
        written = {
            n: etree.tostring(t, xml_declaration=True, encoding="UTF-8", standalone=True) for n, t in parts.items()
        }
        return rezipped(kind, z, written)

    return Parsed(segments, True, rebuild)


def check_members(kind: str, z: zipfile.ZipFile, read: Collection[str] = ()) -> None:
    """Every member but those already `read` unpacks (CRC-32 checked), or ApiError invalid_document names the first
    that does not: found as the file is read, not as its translation is written."""
    for info in z.infolist():
        if info.filename not in read:
            for _ in member_pieces(kind, z, info.filename):
                pass


def rezipped(kind: str, z: zipfile.ZipFile, written: Mapping[str, bytes]) -> bytes:
    """The zip again: the `written` members' new bytes, every other member byte for byte, all in their order and
    with their compression (an OpenDocument's or EPUB's mimetype stays first and stored)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as new:
        for info in z.infolist():
            body = written.get(info.filename)
            body = body if body is not None else zip_member(kind, z, info.filename)
            new.writestr(info, body, compress_type=info.compress_type)
    return out.getvalue()


def zip_member(kind: str, z: zipfile.ZipFile, name: str) -> bytes:
    """A zip member's bytes, or ApiError invalid_document naming it: read a piece at a time, so no more than the
    size its directory claims is inflated (ZipFile.read inflates a deflated member's stream up to 2 GiB, whatever
    the directory says, before it cuts it to that size)."""
    return b"".join(member_pieces(kind, z, name))


def member_pieces(kind: str, z: zipfile.ZipFile, name: str) -> Iterator[bytes]:
    """A zip member's bytes READ_PIECE at a time, up to the size its directory claims (CRC-32 checked there)."""
    info = z.getinfo(name)
    if info.compress_type not in MEMBER_METHODS:  # bzip2 and LZMA inflate a whole stream a call
        raise ApiError(
            "invalid_document",
            f"the {kind} file's part {name[:200]!r} is compressed by method {info.compress_type}; "
            "a document's parts are stored or deflated",
        )
    try:
        with z.open(info) as f:
            while piece := f.read(READ_PIECE):
                yield piece
    except _UNREADABLE as exc:
        raise ApiError(
            "invalid_document", f"the {kind} file's part {name[:200]!r} does not unpack ({_why(exc)})"
        ) from None


def parse_bounded(kind: str, name: str, xml: bytes, budget: list[int]) -> Any:
    """A part's XML (`name`: the part's, or "" for a file that is one) as a tree, its elements counted against
    budget[0] (shared by the document's parts) as they are parsed: ApiError document_too_large once past it,
    invalid_document where it does not parse or declares a DTD (entities it declares could be read one way here and
    another by the program the file goes back to)."""
    parser = etree.XMLPullParser(events=("start",), resolve_entities=False, no_network=True, huge_tree=False)
    try:
        for offset in range(0, max(len(xml), 1), 1 << 16):  # a piece at a time: the count is checked as it grows
            parser.feed(xml[offset : offset + (1 << 16)])
            for _ in parser.read_events():
                budget[0] -= 1
            if budget[0] < 0:
                raise ApiError(
                    "document_too_large", f"the {kind} file holds more than {MAX_ELEMENTS} XML elements in its text"
                )
        root = parser.close()
    except etree.XMLSyntaxError as exc:
        where = f"{name[:200]}: " if name else ""
        raise ApiError("invalid_document", f"the {kind} file's XML does not parse ({where}{exc})") from None
    if root.getroottree().docinfo.doctype:
        part = f"'s part {name[:200]!r}" if name else ""
        raise ApiError("invalid_document", f"the {kind} file{part} declares a DTD (<!DOCTYPE ...>), which it may not")
    return root


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]
