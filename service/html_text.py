"""HTML for translation (LibreTranslate's format="html"): markup kept, prose translated run by run.

A fragment is cut into runs of prose: text and inline elements (<b>, <a href>, <em>, ...) between block
boundaries (every other tag, and <script>, <style>, <code>, <pre> with their content, which stay as they
are). A run reaches the model as plain text, so "A dog <b>runs</b> in the park." is one sentence, not
three fragments. Its inline elements then go over to the translation through the model's word alignment
(model/align.py): an element wraps the target words linked to its source words, clipped inside its parent
and clear of its siblings so the markup stays well nested. An element none of whose words is linked, an
<img> or a comment, goes before the translation of the next source word. Markup is written back as it
came; text is re-escaped.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from html.parser import HTMLParser

from service.sentences import join_sentences

# Phrasing elements that may sit inside a sentence; any other tag ends a run.
INLINE_ELEMENTS = frozenset(
    {
        "a",
        "abbr",
        "b",
        "bdi",
        "bdo",
        "cite",
        "data",
        "del",
        "dfn",
        "em",
        "font",
        "i",
        "ins",
        "kbd",
        "mark",
        "q",
        "s",
        "samp",
        "small",
        "span",
        "strong",
        "sub",
        "sup",
        "time",
        "u",
        "var",
    }
)
INLINE_VOID = frozenset({"img"})  # inline, without content
RAW_ELEMENTS = frozenset({"script", "style", "code", "pre"})  # content is not prose: kept as it is
CDATA_ELEMENTS = frozenset({"script", "style"})  # the parser hands their content over undecoded

Link = tuple[int, int, int, int]  # a target token's character span, then its source token's (model.align.Link)


@dataclass
class Element:
    """An inline element of a run: its source span, its markup as written ("" where the fragment has none)."""

    tag: str
    start: int
    end: int
    open: str
    close: str = ""
    order: int = 0  # document order: an element comes after the elements around it


@dataclass
class Run:
    text: str = ""  # decoded text
    elements: list[Element] = field(default_factory=list)
    original: list[str] = field(default_factory=list)  # the run as it came (text escaped), for blank runs

    @property
    def blank(self) -> bool:
        return not self.text.strip()


# Bounds on one document's markup: the work (and the alignment's) grows with the elements and their
# nesting, and a request must not hold the gateway for long.
MAX_ELEMENTS = 5000  # tags of any kind
MAX_DEPTH = 100  # inline elements open at once


class HtmlLimitError(ValueError):
    """A document with more elements or deeper nesting than the service takes (HTTP 422)."""


class _Splitter(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags = 0
        self.parts: list[str | Run] = []  # markup kept as it is, and runs of prose
        self.run = Run()
        self.open: list[Element] = []  # the run's inline elements not closed yet
        self.raw_depth = 0
        self.cdata = False

    def _markup(self, text: str) -> None:
        self._flush()
        self.parts.append(text)

    def _inline(self, element: Element) -> None:
        element.order = len(self.run.elements)
        self.run.elements.append(element)
        self.run.original.append(element.open or element.close)

    def _flush(self) -> None:
        """End the run: elements still open stop here (their closing tag, if any, comes later as markup)."""
        for element in self.open:
            element.end = len(self.run.text)
        if self.run.text or self.run.elements:
            self.parts.append(self.run)
        self.run, self.open = Run(), []

    def _count(self) -> None:
        self.tags += 1
        if self.tags > MAX_ELEMENTS:
            raise HtmlLimitError(f"more than {MAX_ELEMENTS} HTML tags in one text")
        if len(self.open) >= MAX_DEPTH:
            raise HtmlLimitError(f"HTML inline elements nested more than {MAX_DEPTH} deep")

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._count()
        markup = self.get_starttag_text() or f"<{tag}>"
        if self.raw_depth or (tag not in INLINE_ELEMENTS and tag not in INLINE_VOID):
            self._markup(markup)
            self.raw_depth += tag in RAW_ELEMENTS
            self.cdata = tag in CDATA_ELEMENTS
            return
        at = len(self.run.text)
        element = Element(tag, at, at, markup)
        self._inline(element)
        if tag in INLINE_ELEMENTS:
            self.open.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._count()
        markup = self.get_starttag_text() or f"<{tag}/>"
        if self.raw_depth or tag not in INLINE_VOID:
            self._markup(markup)
        else:
            self._inline(Element(tag, len(self.run.text), len(self.run.text), markup))

    def handle_endtag(self, tag: str) -> None:
        self._count()
        markup = f"</{tag}>"
        if self.raw_depth or tag not in INLINE_ELEMENTS:
            self._markup(markup)
            if tag in RAW_ELEMENTS and self.raw_depth:
                self.raw_depth -= 1
            self.cdata = False
            return
        at = len(self.run.text)
        opened = [i for i, e in enumerate(self.open) if e.tag == tag]
        if not opened:  # a closing tag without its opening one: kept, as an element of its own
            self._inline(Element(tag, at, at, "", markup))
            return
        for element in self.open[opened[-1] :]:  # elements opened inside it and never closed end here too
            element.end = at
        self.open[opened[-1]].close = markup
        self.run.original.append(markup)
        del self.open[opened[-1] :]

    def handle_data(self, data: str) -> None:
        if self.cdata or self.raw_depth:
            self.parts.append(data if self.cdata else html.escape(data, quote=False))
            return
        # Character references are decoded here (convert_charrefs), so text goes back out escaped.
        self.run.text += data
        self.run.original.append(html.escape(data, quote=False))

    def handle_comment(self, data: str) -> None:
        if self.raw_depth:
            self.parts.append(f"<!--{data}-->")
        else:  # inside a sentence, a comment stays there
            self._inline(Element("", len(self.run.text), len(self.run.text), f"<!--{data}-->"))

    def handle_decl(self, decl: str) -> None:
        self._markup(f"<!{decl}>")

    def handle_pi(self, data: str) -> None:
        self._markup(f"<?{data}>")

    def unknown_decl(self, data: str) -> None:
        self._markup(f"<![{data}]>")

    def close(self) -> None:
        super().close()
        self._flush()


class HtmlDocument:
    """A fragment as markup and runs of prose: `texts` to translate, `render` to put translations back."""

    def __init__(self, fragment: str) -> None:
        splitter = _Splitter()
        splitter.feed(fragment)
        splitter.close()
        self.parts = splitter.parts
        self.runs = [p for p in self.parts if isinstance(p, Run) and not p.blank]
        self.texts = [run.text.strip() for run in self.runs]

    @property
    def needs_alignment(self) -> list[bool]:
        """Per run to translate: whether it holds inline markup that must be carried over."""
        return [bool(run.elements) for run in self.runs]

    def render(self, translations: list[str], links: list[list[Link]] | None = None) -> str:
        """The fragment with each run's text replaced by its translation; links[i] (run i's alignment,
        target spans in translations[i], source spans in texts[i]) place its inline elements."""
        if len(translations) != len(self.runs):
            raise ValueError(f"{len(translations)} translations for {len(self.runs)} runs")
        out, i = [], 0
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
            elif part.blank:
                out.append("".join(part.original))
            else:
                out.append(_render_run(part, translations[i], links[i] if links else []))
                i += 1
        return "".join(out)


def _render_run(run: Run, translation: str, links: list[Link]) -> str:
    """lead + translation + trail, with the run's elements wrapped around the words linked to theirs."""
    lead = run.text[: len(run.text) - len(run.text.lstrip())]
    trail = run.text[len(run.text.rstrip()) :]
    text, shift = lead + translation + trail, len(lead)
    # Links in the run's coordinates: target spans in `text`, source spans in run.text.
    spans = sorted((t0 + shift, t1 + shift, s0 + shift, s1 + shift) for t0, t1, s0, s1 in links)
    parents = [_parent(run.elements, e) for e in run.elements]
    placed: dict[int, tuple[int, int]] = {}  # element order -> its target span
    for element, parent in zip(run.elements, parents, strict=True):  # document order: parents first
        lo, hi = placed[parent.order] if parent is not None else (0, len(text))
        # A token linked to the sentence end (</s>, an empty span: often the full stop) belongs to an
        # element that reaches that end.
        hits = [
            (t0, t1)
            for t0, t1, s0, s1 in spans
            if (s0 < element.end and s1 > element.start) or (s0 == s1 and element.start < s0 <= element.end)
        ]
        if hits and element.start < element.end:
            start, end = min(t for t, _ in hits), max(t for _, t in hits)
            # Around the first (last) word, an edge in the leading (trailing) whitespace stays where it was:
            # that whitespace is copied as it is.
            if start == len(lead) and element.start <= len(lead):
                start = element.start
            if end == len(lead) + len(translation) and element.end >= len(run.text.rstrip()):
                end = len(text) - (len(run.text) - element.end)
        elif element.start <= len(lead):  # before the first word: where it was in the leading whitespace
            start = end = element.start
        else:
            start = end = _anchor(spans, element.start, len(lead) + len(translation))
        start, end = min(max(start, lo), hi), max(min(end, hi), lo)
        siblings = [placed[o.order] for o in run.elements[: element.order] if parents[o.order] is parent]
        for a, b in siblings:  # clear of siblings already placed
            if a < b and start < b and end > a:
                start, end = (b, max(end, b)) if start >= a else (start, min(end, a))
        if any(a < b and start < b and max(start, end) > a for a, b in siblings):
            end = start  # still crossing one: left empty where it starts
        placed[element.order] = (start, max(start, end))
    events = []
    for element in run.elements:
        start, end = placed[element.order]
        if start == end:  # empty: its markup together, among the openings at that point
            events.append((start, 1, element.order, element.open + element.close))
        else:
            events += [(start, 1, element.order, element.open), (end, 0, -element.order, element.close)]
    out, at = [], 0
    for pos, _, _, markup in sorted(events):
        out += [html.escape(text[at:pos], quote=False), markup]
        at = pos
    out.append(html.escape(text[at:], quote=False))
    return "".join(out)


def _parent(elements: list[Element], element: Element) -> Element | None:
    """The innermost earlier element whose source span holds this one's."""
    for other in reversed(elements[: element.order]):
        if other.start <= element.start and element.end <= other.end and other.start < other.end:
            return other
    return None


def _anchor(spans: list[tuple[int, int, int, int]], source_at: int, default: int) -> int:
    """Where an element without linked words goes: before the translation of the next source word."""
    after = [(s0, t0) for t0, _, s0, _ in spans if s0 >= source_at]
    if not after:
        return default
    first = min(s0 for s0, _ in after)
    return min(t0 for s0, t0 in after if s0 == first)


def join_aligned(
    sentences: list[str],
    separators: list[str],
    translations: list[str],
    links: list[list[Link]],
) -> tuple[str, list[Link]]:
    """A run's translation from its sentences' (split_sentences' pieces, each translated and aligned on its
    own), with the links moved from sentence coordinates into the run's."""
    out: list[Link] = []
    src_at = tgt_at = 0
    for sentence, translation, sep, found in zip(sentences, translations, [*separators, ""], links, strict=True):
        out += [(t0 + tgt_at, t1 + tgt_at, s0 + src_at, s1 + src_at) for t0, t1, s0, s1 in found]
        src_at += len(sentence) + len(sep)
        tgt_at += len(translation) + len(sep)
    return join_sentences(translations, separators), out


def parse_documents(fragments: list[str]) -> list[HtmlDocument]:
    """HtmlDocument of each fragment; raises HtmlLimitError past MAX_ELEMENTS or MAX_DEPTH."""
    return [HtmlDocument(f) for f in fragments]
