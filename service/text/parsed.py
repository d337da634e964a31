"""A parsed document: its segments to translate and how to put the translated ones back into a file."""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass

from service.text.html_text import TAG


@dataclass
class Parsed:
    """A document's segments to translate (HTML fragments when `html`) and how to put it back together."""

    segments: list[str]
    html: bool
    rebuild: Callable[[list[str]], bytes]

    @property
    def characters(self) -> int:
        """The characters of text to translate (markup not counted): what a document is billed."""
        if not self.html:
            return sum(map(len, self.segments))
        return sum(len(html.unescape(TAG.sub("", s))) for s in self.segments)
