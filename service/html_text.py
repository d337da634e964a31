"""HTML as tags kept verbatim around text nodes to translate (LibreTranslate's format="html")."""

from __future__ import annotations

import html
from html.parser import HTMLParser

# Elements whose content is not prose: kept as it is.
RAW_ELEMENTS = {"script", "style", "code", "pre"}
CDATA_ELEMENTS = {"script", "style"}  # the parser hands their content over undecoded


class _Splitter(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[tuple[bool, str]] = []  # (translate it, text); markup and raw text are kept
        self.raw_depth = 0
        self.cdata = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.parts.append((False, self.get_starttag_text() or f"<{tag}>"))
        self.raw_depth += tag in RAW_ELEMENTS
        self.cdata = tag in CDATA_ELEMENTS

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.parts.append((False, self.get_starttag_text() or f"<{tag}/>"))

    def handle_endtag(self, tag: str) -> None:
        self.parts.append((False, f"</{tag}>"))
        if tag in RAW_ELEMENTS and self.raw_depth:
            self.raw_depth -= 1
        self.cdata = False

    def handle_data(self, data: str) -> None:
        if self.cdata:
            self.parts.append((False, data))
            return
        # Character references are decoded here (convert_charrefs), so text goes back out escaped.
        self.parts.append((not self.raw_depth and bool(data.strip()), html.escape(data, quote=False)))

    def handle_comment(self, data: str) -> None:
        self.parts.append((False, f"<!--{data}-->"))

    def handle_decl(self, decl: str) -> None:
        self.parts.append((False, f"<!{decl}>"))

    def handle_pi(self, data: str) -> None:
        self.parts.append((False, f"<?{data}>"))

    def unknown_decl(self, data: str) -> None:
        self.parts.append((False, f"<![{data}]>"))


class HtmlDocument:
    """A fragment split into markup and text nodes: `texts` to translate, `join` to put translations back."""

    def __init__(self, fragment: str) -> None:
        splitter = _Splitter()
        splitter.feed(fragment)
        splitter.close()
        self.parts = splitter.parts
        self.texts = [html.unescape(text).strip() for translate, text in self.parts if translate]

    def join(self, translations: list[str]) -> str:
        """The fragment with each text node replaced by its translation (its surrounding whitespace kept)."""
        if len(translations) != len(self.texts):
            raise ValueError(f"{len(translations)} translations for {len(self.texts)} text nodes")
        out, it = [], iter(translations)
        for translate, text in self.parts:
            if translate:
                lead, trail = text[: len(text) - len(text.lstrip())], text[len(text.rstrip()):]
                text = lead + html.escape(next(it), quote=False) + trail
            out.append(text)
        return "".join(out)


def join_nbest(docs: list[HtmlDocument], nbest: list[list[str]], n: int) -> list[list[str]]:
    """Each document's n fragments, best first: rank r puts back every text node's r-th hypothesis (or its
    last, where its list is shorter). nbest holds the text nodes' hypotheses in document order."""
    out, start = [], 0
    for doc in docs:
        nodes = nbest[start : start + len(doc.texts)]
        start += len(doc.texts)
        out.append([doc.join([hyps[min(r, len(hyps) - 1)] for hyps in nodes]) for r in range(n)])
    return out
