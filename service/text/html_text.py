"""HTML for translation (LibreTranslate's format="html"): markup kept, prose translated run by run.

A fragment is cut into runs of prose: text and inline elements (<b>, <a href>, <em>, ...) between block
boundaries (every other tag, and <script>, <style>, <code>, <pre> with their content, which stay as they
are). A run reaches the model as plain text, so "A dog <b>runs</b> in the park." is one sentence, not
three fragments. Its inline elements then go over to the translation through the model's word alignment
(model/decode/align.py): an element wraps the target words linked to its source words, clipped inside its parent
and clear of its siblings so the markup stays well nested. An element none of whose words is linked, an
<img> or a comment, goes before the translation of the next source word. Markup is written back as it
came; text is re-escaped. <br> is inline: a line break inside a sentence does not cut it in two.

Content not to translate (HTML's translate="no", class="notranslate", and the tags a request names in
`ignore_tags`, as DeepL and Google honour them) comes back verbatim and in place. Inside a sentence
such an element stays in the model's input (its words give the sentence its sense) and is carried
over by the alignment like any inline element, but it is written with its original content instead
of the words linked to it. Outside one (a block element: <div translate="no">) it is kept as it is,
as <code> and <pre> are.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

from service.errors import CodedError
from service.text.sentences import join_sentences

# Phrasing elements that may sit inside a sentence; any other tag ends a run.
# A tag in markup the HTML path wrote or read (a start or end tag, a comment with no < or > inside): stripped to
# count a segment's characters, to read a translated run's text, to detect a text's language without its markup.
TAG = re.compile(r"<[^<>]*>")

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
INLINE_VOID = frozenset({"img", "br", "wbr"})  # inline, without content
# Elements whose end tag HTML leaves out: never pushed on the stack of a kept block.
VOID_ELEMENTS = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
)
RAW_ELEMENTS = frozenset({"script", "style", "code", "pre"})  # content is not prose: kept as it is
CDATA_ELEMENTS = frozenset({"script", "style"})  # the parser hands their content over undecoded

Link = tuple[int, int, int, int]  # a target token's character span, then its source token's (model.decode.align.Link)


@dataclass
class Element:
    """An inline element of a run: its source span, its markup as written ("" where the fragment has none)."""

    tag: str
    start: int
    end: int
    open: str
    close: str = ""
    order: int = 0  # document order: an element comes after the elements around it
    verbatim: list[str] | None = None  # not to translate: its content's markup as written


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


class HtmlLimitError(CodedError, ValueError):
    """A document with more elements or deeper nesting than the service takes."""

    code = "html_too_complex"


class HtmlSyntaxError(CodedError, ValueError):
    """A document that ends inside markup (a tag, comment or declaration left open), whose text a
    browser would not show and the service could not put back as sent."""

    code = "html_malformed"


def keep_as_is(tag: str, attrs: list[tuple[str, str | None]], ignore_tags: frozenset[str]) -> bool:
    """Whether an element's content is not to be translated."""
    if tag in ignore_tags:
        return True
    for name, value in attrs:
        if name == "translate" and (value or "").strip().lower() == "no":
            return True
        if name == "class" and "notranslate" in (value or "").split():
            return True
    return False


def _close(stack: list[str], tag: str) -> bool:
    """Close the innermost open `tag` of a stack of open tags (and what was opened inside it and never
    closed); False when it is not open."""
    if tag not in stack:
        return False
    del stack[len(stack) - 1 - stack[::-1].index(tag) :]
    return True


class _Splitter(HTMLParser):
    def __init__(self, ignore_tags: frozenset[str] = frozenset()) -> None:
        super().__init__(convert_charrefs=True)
        self.ignore_tags = ignore_tags
        self.kept: list[str] = []  # a block not to translate: the tags open inside it, its own first
        self.verbatim: Element | None = None  # the inline element not to translate that is open
        self.verbatim_open: list[str] = []  # tags open inside it
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

    def _keep(self, markup: str) -> None:
        """Markup inside the open inline element not to translate: its content, as written (and the
        run's, as it came)."""
        assert self.verbatim is not None and self.verbatim.verbatim is not None
        self.verbatim.verbatim.append(markup)
        self.run.original.append(markup)

    def _inline_void(self, tag: str, markup: str) -> None:
        """<img>, <br>, <wbr>: an empty element at this point of the run. A line break separates words
        ("one<br>two" gives the model two); an image or a word-break opportunity does not."""
        if tag == "br" and self.run.text and not self.run.text[-1].isspace():
            self.run.text += " "
        at = len(self.run.text)
        self._inline(Element(tag, at, at, markup))

    def _count(self) -> None:
        self.tags += 1
        if self.tags > MAX_ELEMENTS:
            raise HtmlLimitError(f"more than {MAX_ELEMENTS} HTML tags in one text")

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._count()
        markup = self.get_starttag_text() or f"<{tag}>"
        if self.verbatim is not None:  # inside an inline element not to translate: its markup as it is
            self._keep(markup)
            if tag not in VOID_ELEMENTS:
                self.verbatim_open.append(tag)
            return
        if self.kept:
            self._markup(markup)
            if tag not in VOID_ELEMENTS:
                self.kept.append(tag)
            return
        if self.raw_depth or (tag not in INLINE_ELEMENTS and tag not in INLINE_VOID):
            self._markup(markup)
            self.raw_depth += tag in RAW_ELEMENTS
            self.cdata = tag in CDATA_ELEMENTS
            if not self.raw_depth and tag not in VOID_ELEMENTS and keep_as_is(tag, attrs, self.ignore_tags):
                self.kept.append(tag)
            return
        if tag in INLINE_VOID:
            self._inline_void(tag, markup)
            return
        if len(self.open) >= MAX_DEPTH:
            raise HtmlLimitError(f"HTML inline elements nested more than {MAX_DEPTH} deep")
        at = len(self.run.text)
        element = Element(tag, at, at, markup)
        self._inline(element)
        self.open.append(element)
        if keep_as_is(tag, attrs, self.ignore_tags):
            element.verbatim = []
            self.verbatim = element

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._count()
        markup = self.get_starttag_text() or f"<{tag}/>"
        if self.verbatim is not None:
            self._keep(markup)
        elif self.kept or self.raw_depth or tag not in INLINE_VOID:
            self._markup(markup)
        else:
            self._inline_void(tag, markup)

    def handle_endtag(self, tag: str) -> None:
        self._count()
        markup = f"</{tag}>"
        if self.verbatim is not None:
            if _close(self.verbatim_open, tag) or tag != self.verbatim.tag:
                self._keep(markup)
                return
            self.verbatim, self.verbatim_open = None, []  # its own end: closed below as any inline element
        if self.kept:
            self._markup(markup)
            _close(self.kept, tag)
            return
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
        if self.verbatim is not None:  # the model reads it; the output has it as written
            self._keep(html.escape(data, quote=False))
            self.run.text += data
            return
        if self.kept:
            self.parts.append(html.escape(data, quote=False))
            return
        if self.cdata or self.raw_depth:
            self.parts.append(data if self.cdata else html.escape(data, quote=False))
            return
        # Character references are decoded here (convert_charrefs), so text goes back out escaped.
        self.run.text += data
        self.run.original.append(html.escape(data, quote=False))

    def handle_comment(self, data: str) -> None:
        if self.verbatim is not None:
            self._keep(f"<!--{data}-->")
        elif self.kept or self.raw_depth:
            self.parts.append(f"<!--{data}-->")
        else:  # inside a sentence, a comment stays there
            self._inline(Element("", len(self.run.text), len(self.run.text), f"<!--{data}-->"))

    def _declaration(self, markup: str) -> None:
        """<!DOCTYPE>, <?pi?>, <![CDATA[...]]>: kept as written; outside kept content it ends the run."""
        if self.verbatim is not None:
            self._keep(markup)
        elif self.kept or self.raw_depth:
            self.parts.append(markup)
        else:
            self._markup(markup)

    def handle_decl(self, decl: str) -> None:
        if "[" in decl and decl[:7].upper() == "DOCTYPE":  # the parser reads it to its first ">": the rest as text
            raise HtmlSyntaxError("the DOCTYPE declares an internal subset (entities), which HTML does not have")
        self._declaration(f"<!{decl}>")

    def handle_pi(self, data: str) -> None:
        self._declaration(f"<?{data}>")

    def unknown_decl(self, data: str) -> None:
        # A marked section: the parser gives "CDATA[x" for <![CDATA[x]]>, "if IE" for <![if IE]>.
        self._declaration(f"<![{data}]]>" if data.startswith("CDATA[") else f"<![{data}]>")

    def close(self) -> None:
        """End of the fragment. What the parser still holds is an open <script> or <style>'s content (kept
        as written, as a browser reads it: the element runs to the end) or markup left unfinished."""
        tail = self.rawdata
        if self.cdata_elem is not None and tail:
            self.parts.append(tail)
            self.rawdata = ""
        elif len(tail) > 1 and tail[0] == "<" and (tail[1].isalpha() or tail[1] in "/!?"):
            at = self.getpos()[1] if self.getpos()[0] == 1 else None
            where = f"at character {at}" if at is not None else f"on line {self.getpos()[0]}"
            raise HtmlSyntaxError(
                f"the HTML ends inside a tag, comment or declaration ({tail[:20]!r} {where}); "
                "finish it, or write a literal '<' as &lt;"
            )
        super().close()
        self._flush()


class HtmlDocument:
    """A fragment as markup and runs of prose: `texts` to translate, `render` to put translations back."""

    def __init__(self, fragment: str, ignore_tags: frozenset[str] = frozenset()) -> None:
        splitter = _Splitter(ignore_tags)
        splitter.feed(fragment)
        splitter.close()
        self.parts = splitter.parts
        self.tags = splitter.tags  # of any kind, as MAX_ELEMENTS counts them
        self.runs = [p for p in self.parts if isinstance(p, Run) and not p.blank]
        self.texts = [run.text.strip() for run in self.runs]

    @property
    def needs_alignment(self) -> list[bool]:
        """Per run to translate: whether it holds inline markup that must be carried over."""
        return [bool(run.elements) for run in self.runs]

    def with_fragments(self, fragments: list[str]) -> str:
        """The document with each run to translate replaced by a fragment of markup (a document's translated
        segment), or as it came where the fragment is empty."""
        done = dict(zip(map(id, self.runs), fragments, strict=True))
        return "".join(p if isinstance(p, str) else done.get(id(p)) or "".join(p.original) for p in self.parts)

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
    skip: list[tuple[int, int]] = []  # target spans written as an element's original content instead
    for element in run.elements:
        start, end = placed[element.order]
        if element.verbatim is not None:  # its own content where its words' translation was
            copied = _copied(text, run.text[element.start : element.end], skip)
            if copied is not None:  # the translation holds it as written (a memory's unit, a model that copies)
                start, end = copied
            else:
                start, end = _outside_punctuation(text, *_whole_words(text, start, end), run.text, element)
            # Spaced from the words around as it was in the source ("Acme Cloud</span> Hemd", not "</span>Hemd").
            before = (
                " "
                if start and text[start - 1].isalnum() and run.text[element.start - 1 : element.start].isspace()
                else ""
            )
            after = " " if text[end : end + 1].isalnum() and run.text[element.end : element.end + 1].isspace() else ""
            markup = before + element.open + "".join(element.verbatim) + element.close + after
            events.append((start, 1, element.order, markup))
            skip.append((start, end))
        elif start == end:  # empty: its markup together, among the openings at that point
            events.append((start, 1, element.order, element.open + element.close))
        else:
            events += [(start, 1, element.order, element.open), (end, 0, -element.order, element.close)]
    out, at = [], 0
    for pos, _, _, markup in sorted(events):
        out += [_text(text, at, pos, skip), markup]
        at = max(at, pos)
    out.append(_text(text, at, len(text), skip))
    return "".join(out)


def _copied(text: str, content: str, skip: list[tuple[int, int]]) -> tuple[int, int] | None:
    """Where the translation holds an element's content as written, where it holds it once and clear of the
    spans already placed: there it goes, and no word the alignment linked to it is lost."""
    content = content.strip()
    at = text.find(content) if content else -1
    if at < 0 or text.find(content, at + 1) >= 0 or any(a < at + len(content) and at < b for a, b in skip):
        return None
    return at, at + len(content)


def _whole_words(text: str, start: int, end: int) -> tuple[int, int]:
    """A span the original content replaces: without whitespace at its edges (the words around keep
    their spacing), out to whole words (no piece of a word the model made of it is left over)."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    if start == end:
        return start, end
    while start > 0 and text[start - 1].isalnum() and text[start].isalnum():
        start -= 1
    while end < len(text) and text[end - 1].isalnum() and text[end].isalnum():
        end += 1
    return start, end


def _outside_punctuation(text: str, start: int, end: int, source: str, element: Element) -> tuple[int, int]:
    """The span without the punctuation at its edges that the source has just outside the element: a
    full stop after a URL or a term is the sentence's, though the alignment may link it to the element."""
    after = source[element.end : element.end + 1]
    while end > start and not text[end - 1].isalnum() and not text[end - 1].isspace() and text[end - 1] == after:
        end -= 1
        after = ""  # one character: the source has one there
    before = source[element.start - 1 : element.start] if element.start else ""
    if end > start and not text[start].isalnum() and not text[start].isspace() and text[start] == before:
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _text(text: str, start: int, end: int, skip: list[tuple[int, int]]) -> str:
    """text[start:end], escaped, without the characters inside the spans of `skip`."""
    if not skip:
        return html.escape(text[start:end], quote=False)
    keep = [c for i, c in enumerate(text[start:end], start) if not any(a <= i < b for a, b in skip)]
    return html.escape("".join(keep), quote=False)


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


def parse_documents(fragments: list[str], ignore_tags: frozenset[str] = frozenset()) -> list[HtmlDocument]:
    """HtmlDocument of each fragment; raises HtmlLimitError past MAX_ELEMENTS or MAX_DEPTH, and
    HtmlSyntaxError for a fragment that ends inside markup."""
    return [HtmlDocument(f, ignore_tags) for f in fragments]
