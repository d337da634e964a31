"""service.html_text: LibreTranslate's format="html" keeps markup and translates only text nodes."""

from __future__ import annotations

from service.html_text import HtmlDocument, join_nbest


def test_text_nodes_are_split_from_markup_and_put_back_in_place() -> None:
    doc = HtmlDocument('<p class="lead">A dog &amp; a cat.</p>\n<br/><!-- note --><b> Two men </b>')
    assert doc.texts == ["A dog & a cat.", "Two men"]  # entities decoded, whitespace-only nodes left alone
    out = doc.join(["Ein Hund & eine Katze.", "Zwei Männer"])
    assert out == '<p class="lead">Ein Hund &amp; eine Katze.</p>\n<br/><!-- note --><b> Zwei Männer </b>'


def test_scripts_styles_and_code_are_not_translated_or_re_escaped() -> None:
    fragment = "<style>p > a {}</style><script>if (a < b && c) {}</script><pre>x &amp; y</pre><p>Hi</p>"
    doc = HtmlDocument(fragment)
    assert doc.texts == ["Hi"]
    assert doc.join(["Hallo"]) == fragment.replace("Hi", "Hallo")


def test_nbest_ranks_put_each_nodes_hypothesis_of_that_rank_back() -> None:
    docs = [HtmlDocument("<i>one</i> <b>two</b>"), HtmlDocument("<hr>"), HtmlDocument("three")]
    nbest = [["eins", "1"], ["zwei"], ["drei", "3"]]  # "two" has one hypothesis only
    assert join_nbest(docs, nbest, 2) == [
        ["<i>eins</i> <b>zwei</b>", "<i>1</i> <b>zwei</b>"],
        ["<hr>", "<hr>"],
        ["drei", "3"],
    ]
