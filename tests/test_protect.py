"""service.text.protect: URLs, e-mail addresses and placeholders found and wrapped, and plain text given back."""

from __future__ import annotations

import random

import pytest

from service.text.protect import PROTECTED, from_html, has_protected, to_html


@pytest.mark.parametrize(
    ("text", "spans"),
    [
        ("See https://example.com/a?b=1&c=2. It is new.", ["https://example.com/a?b=1&c=2"]),
        ("Visit www.example.org, then rest.", ["www.example.org"]),
        ("Write to bob.smith+news@mail.example.co.uk today.", ["bob.smith+news@mail.example.co.uk"]),
        ("Hello {name}, you have {{count}} new messages.", ["{name}", "{{count}}"]),
        ("%s sent %(n)d files to %d people.", ["%s", "%(n)d", "%d"]),
        ("The total is $total and ${tax} more.", ["$total", "${tax}"]),
        ("A dog runs in the park (fast).", []),
    ],
)
def test_protected_spans_are_found(text: str, spans: list[str]) -> None:
    assert [m.group() for m in PROTECTED.finditer(text)] == spans
    assert has_protected(text) == bool(spans)


def test_wrapping_and_unwrapping_is_the_identity() -> None:
    rng = random.Random(0)
    pieces = ["a <b> & c", "https://x.org/?q=<1>&r", "{x}", " ", "%s", "bob@x.io", "\"'", "&amp;", "$y", "."]
    for _ in range(500):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        assert from_html(to_html(text)) == text


def test_the_sentence_s_full_stop_stays_when_the_alignment_links_it_to_the_url() -> None:
    from service.text.html_text import parse_documents

    source = "Dogs play near https://dogs.example."
    [doc] = parse_documents([to_html(source)])
    translation = "Hunde spielen nahe Zffeln."
    url = source.index("https")
    # Each target word to its source word; "Zffeln" and the full stop both to a piece of the URL, as
    # a model that has never seen a URL may attend.
    words = [("Hunde", "Dogs"), ("spielen", "play"), ("nahe", "near")]
    links = [
        (translation.index(t), translation.index(t) + len(t), source.index(s), source.index(s) + len(s))
        for t, s in words
    ]
    links += [(19, 25, url, url + 5), (25, 26, url + 5, url + 6)]
    out = from_html(doc.render([translation], [links]))
    assert out == "Hunde spielen nahe https://dogs.example."
    # Without the source's full stop after the URL, the linked one goes with the URL's words.
    [bare] = parse_documents([to_html(source[:-1])])
    assert from_html(bare.render([translation], [links])) == "Hunde spielen nahe https://dogs.example"


def test_the_quick_check_agrees_with_the_search_on_random_text() -> None:
    """has_protected skips the search for a text without any of the marks; a pattern that a text
    without them could match would make it miss spans."""
    rng = random.Random(2)
    alphabet = ["a", "Z", "1", " ", ".", ",", "_", "-", "+", "(", ")", "{", "}", "%", "$", "@", ":", "/", "w"]
    alphabet += ["www.", "://", "http", "ftp", "{{", "}}", "%(x)", "s", "d", "${", "\n"]
    for _ in range(20000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        assert has_protected(text) == (PROTECTED.search(text) is not None), repr(text)
