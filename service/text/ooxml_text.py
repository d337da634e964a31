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
from collections import Counter
from dataclasses import dataclass
from typing import Any

from lxml import etree

from service.api.errors import ApiError
from service.text.documents import Parsed

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
                out.append(f'<a data-h="{self.links.index(c)}">{inner}</a>')
            else:
                out.append(self._run(c))
        return "".join(out)

    def _run(self, run: Any) -> str:
        i = self.runs.index(run)
        if not self._plain(run):
            return f'<img data-r="{i}">'
        text = html.escape(self._text(run), quote=False)
        return text if self._formatting(run) == self.common else f'<span data-r="{i}">{text}</span>'

    def rebuild(self, translated: str) -> None:
        """The paragraph's runs replaced by the translation's pieces, in its order."""
        if self.direct is not None:
            self._set_text(self.direct, html.unescape(_TAGS.sub("", translated)))
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
        at = list(self.p).index(self.content[0])
        for c in self.content:
            self.p.remove(c)
        for offset, element in enumerate(built):
            self.p.insert(at + offset, element)

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


_TAGS = re.compile(r"<[^<>]*>")
_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=False)


def _paragraphs(parts: dict[str, Any], d: Dialect) -> list[_Paragraph]:
    ordered = sorted(parts, key=lambda n: _order(n, d) or (0, []))
    found = [_Paragraph(p, d) for name in ordered for p in parts[name].iter(*d.paragraph)]
    return [p for p in found if p.text.strip()]


def _order(name: str, d: Dialect) -> tuple[int, list[Any]] | None:
    """A part's place (the body before headers, slides before notes, slide2 before slide10); None for a
    part without text to translate."""
    group = next((i for i, pattern in enumerate(d.parts) if re.fullmatch(pattern, name)), None)
    return None if group is None else (group, [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)])


def office_document(kind: str, data: bytes) -> Parsed:
    """A .docx, .pptx or .xlsx file (its zip already checked: documents.unzipped_safely) as segments."""
    d = DIALECTS[kind]

    def read() -> tuple[zipfile.ZipFile, dict[str, Any]]:
        z = zipfile.ZipFile(io.BytesIO(data))
        if d.main not in z.namelist():
            raise ApiError("invalid_document", f"not {d.name}: it has no {d.main}")
        names = [n for n in z.namelist() if _order(n, d) is not None]
        try:
            return z, {n: etree.fromstring(z.read(n), _PARSER) for n in names}
        except etree.XMLSyntaxError as exc:
            raise ApiError("invalid_document", f"the {kind} file's XML does not parse ({exc})") from None

    _, parts = read()
    segments = [p.fragment() for p in _paragraphs(parts, d)]

    def rebuild(translations: list[str]) -> bytes:
        z, parts = read()  # afresh: the same paragraphs, in the same order
        for paragraph, translated in zip(_paragraphs(parts, d), translations, strict=True):
            paragraph.rebuild(translated)
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as new:
            for info in z.infolist():
                body = z.read(info)
                if info.filename in parts:
                    body = etree.tostring(parts[info.filename], xml_declaration=True, encoding="UTF-8", standalone=True)
                new.writestr(info, body, compress_type=info.compress_type)
        return out.getvalue()

    return Parsed(segments, True, rebuild)
