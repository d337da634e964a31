"""Plain text that must come back exactly as sent: URLs, e-mail addresses and placeholders.

A model trained on captions mangles `https://example.com/a?b=1`, `bob@example.com`, `{name}`,
`{{count}}`, `%s`, `%(user)s` and `$total`. A text holding any of them goes through the HTML path
(service/text/html_text.py) with each one wrapped in <span translate="no">: the model still reads the
whole sentence, and the span comes back verbatim where the alignment places it. The wrapper is
then taken off and the rest unescaped, so the answer is plain text again.
"""

from __future__ import annotations

import html
import re

_TRAIL = r"[^\s.,;:!?)\]}'\"<>]"  # a URL does not end in the sentence's punctuation
PROTECTED = re.compile(
    rf"(?:https?|ftp)://[^\s<>]*{_TRAIL}"
    rf"|www\.[^\s<>]*{_TRAIL}"
    r"|[\w.+-]+@[\w-]+(?:\.[\w-]+)+"
    r"|\{\{[^{}\n]{0,100}\}\}"
    r"|\{[\w.:-]{0,50}\}"
    r"|%\(\w+\)[sdifrx]"
    r"|%[sdifrx]"
    r"|\$\{?\w+\}?"
)
OPEN = '<span translate="no">'
CLOSE = "</span>"
_WRAPPER = re.compile(re.escape(OPEN) + "|" + re.escape(CLOSE))


# What each of PROTECTED's alternatives holds: a text with none of them has no match, found in C.
_MARKS = ("://", "www.", "@", "{", "%", "$")


def has_protected(text: str) -> bool:
    # The address alternative backtracks at every word start, so most texts skip the search.
    return any(mark in text for mark in _MARKS) and PROTECTED.search(text) is not None


def to_html(text: str) -> str:
    """The text as an HTML fragment: escaped, each protected span wrapped not to be translated."""
    out, at = [], 0
    for m in PROTECTED.finditer(text):
        out += [html.escape(text[at : m.start()], quote=False), OPEN, html.escape(m.group(), quote=False), CLOSE]
        at = m.end()
    out.append(html.escape(text[at:], quote=False))
    return "".join(out)


def from_html(rendered: str) -> str:
    """The rendered fragment as plain text: the wrappers off (the only tags in it), the rest unescaped."""
    return html.unescape(_WRAPPER.sub("", rendered))
