"""Word documents (.docx) for translation: each paragraph as an HTML fragment whose inline markup is
its runs' formatting, and the document rebuilt around the translations (python-docx, at the XML).

A paragraph's runs in its most common formatting (by characters) are its plain text; every other run
is a <span data-r="i"> and a hyperlink an <a data-h="j"> around its runs, so the word alignment
carries them over to the words they cover (service/html_text.py). A run that holds more than text
(a picture, a field, a footnote mark) is an <img data-r="i"> kept in place and written back as it
came. In the rebuilt paragraph, each piece of text becomes a copy of its run with the new text (the
plain text a copy of a run in the common formatting); properties, bookmarks and everything that is
not a run or a hyperlink stay where they were. Tables' cells, headers and footers are paragraphs
like the body's; what is not a paragraph (table structure, pictures, styles) is untouched.
"""

from __future__ import annotations

import copy
import html
import io
import re
from collections import Counter
from typing import Any

import docx
from docx.oxml.ns import qn
from lxml import etree

from service.documents import Parsed
from service.errors import ApiError

R, T, RPR, HYPERLINK, TAB, BR = qn("w:r"), qn("w:t"), qn("w:rPr"), qn("w:hyperlink"), qn("w:tab"), qn("w:br")
TEXT_PARTS = {RPR, T, TAB, BR}  # what a run of plain text holds
_TOKEN = re.compile(r"<(/?)(span|a|img)(?: data-([rh])=\"(\d+)\")?\s*/?>|([^<]+)")


def _plain_run(run: Any) -> bool:
    return all(child.tag in TEXT_PARTS for child in run)


def _run_text(run: Any) -> str:
    out = []
    for child in run:
        if child.tag == T:
            out.append(child.text or "")
        elif child.tag == TAB:
            out.append("\t")
        elif child.tag == BR:
            out.append("\n")
    return "".join(out)


def _formatting(run: Any) -> bytes:
    props = run.find(RPR)
    return etree.tostring(props) if props is not None else b""


class _Paragraph:
    """One paragraph's runs and hyperlinks as an HTML fragment, and the paragraph rebuilt from its translation."""

    def __init__(self, p: Any) -> None:
        self.p = p
        self.content = [c for c in p if c.tag in (R, HYPERLINK)]
        self.runs: list[Any] = []
        self.links: list[Any] = []
        for c in self.content:
            if c.tag == R:
                self.runs.append(c)
            else:
                self.links.append(c)
                self.runs += [r for r in c if r.tag == R]
        shares: Counter[bytes] = Counter()
        for run in self.runs:
            if _plain_run(run):
                shares[_formatting(run)] += len(_run_text(run))
        self.common = shares.most_common(1)[0][0] if shares else b""
        self.text = "".join(_run_text(r) for r in self.runs if _plain_run(r))

    def fragment(self) -> str:
        out = []
        for c in self.content:
            if c.tag == HYPERLINK:
                inner = "".join(self._run(r) for r in c if r.tag == R)
                out.append(f'<a data-h="{self.links.index(c)}">{inner}</a>')
            else:
                out.append(self._run(c))
        return "".join(out)

    def _run(self, run: Any) -> str:
        i = self.runs.index(run)
        if not _plain_run(run):
            return f'<img data-r="{i}">'
        text = html.escape(_run_text(run), quote=False)
        return text if _formatting(run) == self.common else f'<span data-r="{i}">{text}</span>'

    def rebuild(self, translated: str) -> None:
        """The paragraph's runs and hyperlinks replaced by the translation's pieces, in its order."""
        plain = next((r for r in self.runs if _plain_run(r) and _formatting(r) == self.common), None)
        built: list[Any] = []
        link: Any = None
        span: int | None = None
        for m in _TOKEN.finditer(translated):
            closing, tag, _, number, text = m.groups()
            if text is not None:
                template = self.runs[span] if span is not None else plain
                run = _with_text(template, html.unescape(text))
                (link if link is not None else built).append(run)
            elif tag == "img" and number is not None:
                (link if link is not None else built).append(self.runs[int(number)])  # as it came
            elif tag == "span":
                span = None if closing or number is None else int(number)
            elif tag == "a":
                if closing or number is None:
                    link = None
                else:
                    link = copy.deepcopy(self.links[int(number)])
                    for child in [c for c in link if c.tag == R]:
                        link.remove(child)
                    built.append(link)
        at = list(self.p).index(self.content[0])
        for c in self.content:
            self.p.remove(c)
        for offset, element in enumerate(built):
            self.p.insert(at + offset, element)


def _with_text(template: Any, text: str) -> Any:
    """A copy of a run (its formatting; a new plain run when there is none) holding `text`: line breaks
    and tabs as Word writes them."""
    run = copy.deepcopy(template) if template is not None else etree.SubElement(etree.Element("x"), R)
    for child in [c for c in run if c.tag != RPR]:
        run.remove(child)
    for k, piece in enumerate(re.split(r"(\t|\n)", text)):
        if k % 2:
            etree.SubElement(run, TAB if piece == "\t" else BR)
        elif piece:
            t = etree.SubElement(run, T)
            t.text = piece
            t.set("{http://www.w3.org/XML/1998/namespace}space", "preserve")
    return run


def _open(data: bytes) -> Any:
    try:
        return docx.Document(io.BytesIO(data))
    except Exception as exc:  # python-docx's and lxml's errors for a file that is not a Word document
        raise ApiError("invalid_document", f"not a Word document ({type(exc).__name__}: {exc})") from None


def _paragraphs(document: Any) -> list[_Paragraph]:
    """The paragraphs with text of the body (tables' cells included), then of each header and footer
    of its own, in document order."""
    roots = [document.element.body]
    seen: set[int] = set()
    for section in document.sections:
        parts = (section.header, section.footer, section.first_page_header, section.first_page_footer)
        for part in (*parts, section.even_page_header, section.even_page_footer):
            if not part.is_linked_to_previous and id(part._element) not in seen:
                seen.add(id(part._element))
                roots.append(part._element)
    found = [_Paragraph(p) for root in roots for p in root.iter(qn("w:p"))]
    return [p for p in found if p.text.strip()]


def word_document(data: bytes) -> Parsed:
    segments = [p.fragment() for p in _paragraphs(_open(data))]

    def rebuild(translations: list[str]) -> bytes:
        document = _open(data)  # afresh: the same paragraphs, in the same order
        for paragraph, translated in zip(_paragraphs(document), translations, strict=True):
            paragraph.rebuild(translated)
        out = io.BytesIO()
        document.save(out)
        return out.getvalue()

    return Parsed(segments, True, rebuild, "")
