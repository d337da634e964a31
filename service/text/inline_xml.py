"""An XML element's mixed content (text among inline elements) as an HTML fragment, and that content written
back from the fragment's translation: what XLIFF segments (service/text/xliff_text.py) and OpenDocument
paragraphs (service/text/odf_text.py) share, with the top-down walk that gives each element what it inherits.

An inline element that holds text to translate is a <span data-x="i"> around its text, so the word alignment
carries it over to the words it covers (service/text/html_text.py); any other (a code, a picture, a space
element, a comment) is an <img data-x="i">, written back as it came.
"""

from __future__ import annotations

import copy
import html
import re
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from lxml import etree

T = TypeVar("T")
_TOKEN = re.compile(r"<(/?)(span|img)(?: data-x=\"(\d+)\")?\s*/?>|([^<]+)")


def local_name(element: Any) -> str:
    """An element's name without its namespace; "" for a comment or processing instruction."""
    return etree.QName(element).localname if isinstance(element.tag, str) else ""


def top_down(root: Any, state: T, inherit: Callable[[Any, T], T]) -> Iterator[tuple[Any, T]]:
    """Each element of the tree (root first, then in document order, as root.iter()) with the state `inherit`
    gives it from its parent's: an inherited flag in one pass over the tree, where asking each element's
    ancestors costs elements x depth."""
    stack = [(root, inherit(root, state))]
    while stack:
        element, here = stack.pop()
        yield element, here
        stack.extend((child, inherit(child, here)) for child in reversed(element) if isinstance(child.tag, str))


class InlineXml:
    def __init__(self, element: Any, holds_text: Callable[[Any], bool]) -> None:
        self.holds_text = holds_text
        self.codes: list[Any] = []
        self.fragment = self._fragment(element)

    def _fragment(self, element: Any) -> str:
        out = [html.escape(element.text or "", quote=False)]
        for child in element:
            i = len(self.codes)
            self.codes.append(child)
            if self.holds_text(child):
                out.append(f'<span data-x="{i}">{self._fragment(child)}</span>')
            else:
                out.append(f'<img data-x="{i}">')
            out.append(html.escape(child.tail or "", quote=False))
        return "".join(out)

    def fill(self, into: Any, translated: str) -> None:
        """Write the translation as the content of `into` (an element with no text or children yet): its text,
        a copy of each element that holds text around its words, a copy of each other element in its place."""
        open_: list[Any] = [into]
        for m in _TOKEN.finditer(translated):
            closing, tag, number, text = m.groups()
            if text is not None:
                _append_text(open_[-1], html.unescape(text))
            elif tag == "span" and closing:
                if len(open_) > 1:
                    open_.pop()
            elif number is not None and int(number) < len(self.codes):
                code = copy.deepcopy(self.codes[int(number)])
                code.tail = None
                if tag == "span":
                    code.text = None
                    for child in list(code):
                        code.remove(child)
                open_[-1].append(code)
                if tag == "span":
                    open_.append(code)


def _append_text(parent: Any, text: str) -> None:
    if len(parent):
        parent[-1].tail = (parent[-1].tail or "") + text
    else:
        parent.text = (parent.text or "") + text
