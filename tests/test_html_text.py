"""service.text.html_text: LibreTranslate's format="html" translates runs of prose and carries inline markup over."""

from __future__ import annotations

import random
import re

import hypothesis
import hypothesis.strategies as st
import pytest

from service.text.html_text import MAX_DEPTH, HtmlDocument, HtmlLimitError, HtmlSyntaxError, Link, join_aligned


def links(source: str, target: str, pairs: list[tuple[str, str]]) -> list[Link]:
    """Hand-written alignment: each (target word, source word) by their first occurrences."""
    out = []
    for t, s in pairs:
        t0, s0 = target.index(t), source.index(s)
        out.append((t0, t0 + len(t), s0, s0 + len(s)))
    return out


def test_runs_are_cut_at_block_markup_and_inline_elements_stay_inside() -> None:
    doc = HtmlDocument('<p class="lead">A dog &amp; a <b>cat</b>.</p>\n<br/><i> Two men </i><hr>')
    assert doc.texts == ["A dog & a cat.", "Two men"]  # entities decoded, whitespace-only runs left alone
    assert doc.needs_alignment == [True, True]
    out = doc.render(
        ["Ein Hund & eine Katze.", "Zwei Männer"],
        [
            links("A dog & a cat.", "Ein Hund & eine Katze.", [("Katze", "cat"), ("eine", "cat")]),
            links("Two men", "Zwei Männer", [("Zwei", "Two"), ("Männer", "men")]),
        ],
    )
    assert out == '<p class="lead">Ein Hund &amp; <b>eine Katze</b>.</p>\n<br/><i> Zwei Männer </i><hr>'


def test_elements_follow_their_words_nest_and_stay_clear_of_each_other() -> None:
    source = "A woman with a blue hat sings."
    doc = HtmlDocument("<i>A woman with a <b>blue</b> hat</i> <u>sings</u>.")
    target = "Eine Frau singt mit einem blauen Hut."  # the verb moved before the hat
    out = doc.render(
        [target],
        [
            links(
                source,
                target,
                [
                    ("Eine", "woman"),
                    ("Frau", "woman"),
                    ("singt", "sings"),
                    ("mit", "with"),
                    ("blauen", "blue"),
                    ("Hut", "hat"),
                ],
            )
        ],
    )
    # <i> spans its source words' translations and so holds "singt": its sibling <u> is left empty after it.
    assert out == "<i>Eine Frau singt mit einem <b>blauen</b> Hut</i><u></u>."


def test_a_sibling_s_words_inside_another_s_span_do_not_cross_it() -> None:
    source = "A red and blue car."
    doc = HtmlDocument("A <b>red</b> and <i>blue</i> car.")
    target = "Ein rot-blaues Auto."  # both colours linked to one word
    out = doc.render(
        [target], [links(source, target, [("rot-blaues", "red"), ("rot-blaues", "blue"), ("Auto", "car")])]
    )
    assert out == "Ein <b>rot-blaues</b><i></i> Auto."


def test_unlinked_elements_images_and_comments_go_before_the_next_word() -> None:
    source = " A cat  sleeps."
    doc = HtmlDocument("<img src=x> A cat <!-- c --> sleeps.")
    target = "Eine Katze schläft."
    assert doc.texts == ["A cat  sleeps."]
    out = doc.render(
        [target],
        [
            [
                (t0, t1, s0 - 1, s1 - 1)
                for t0, t1, s0, s1 in links(source, target, [("Katze", "cat"), ("schläft", "sleeps")])
            ]
        ],
    )
    assert out == "<img src=x> Eine Katze <!-- c -->schläft."


def test_broken_markup_comes_back_as_it_was_written() -> None:
    doc = HtmlDocument("<p>A dog <b>runs</b></b> in <i>the park.")
    assert doc.texts == ["A dog runs in the park."]
    target = "Ein Hund rennt im Park."
    out = doc.render(
        [target],
        [
            links(
                "A dog runs in the park.", target, [("Hund", "dog"), ("rennt", "runs"), ("im", "in"), ("Park", "park")]
            )
        ],
    )
    assert out == "<p>Ein Hund <b>rennt</b></b> im <i>Park."  # "the" has no word of its own; <i> never closed


def test_scripts_styles_and_code_are_not_translated_or_re_escaped() -> None:
    fragment = "<style>p > a {}</style><script>if (a < b && c) {}</script><pre>x &amp; <b>y</b></pre><p>Hi</p>"
    doc = HtmlDocument(fragment)
    assert doc.texts == ["Hi"] and doc.needs_alignment == [False]
    assert doc.render(["Hallo"]) == fragment.replace("Hi", "Hallo")


def test_blank_runs_come_back_verbatim() -> None:
    fragment = '<a href="x"><div>A dog.</div></a> <b> </b>'
    doc = HtmlDocument(fragment)
    assert doc.texts == ["A dog."]
    assert doc.render(["Ein Hund."]) == fragment.replace("A dog.", "Ein Hund.")


def test_join_aligned_moves_sentence_links_into_the_run() -> None:
    text, moved = join_aligned(
        ["A dog.", "A cat."], [" "], ["Ein Hund.", "Eine Katze."], [[(4, 8, 2, 5)], [(5, 10, 2, 5)]]
    )
    assert text == "Ein Hund. Eine Katze."
    assert moved == [(4, 8, 2, 5), (15, 20, 9, 12)]
    assert text[15:20] == "Katze" and "A dog. A cat."[9:12] == "cat"


def test_a_token_linked_to_the_sentence_end_goes_with_an_element_that_reaches_it() -> None:
    target = "Zwei Männer."
    words = [(0, 4, 0, 3), (5, 11, 4, 7)]  # Zwei -> Two, Männer -> men
    # The full stop is linked to </s>, an empty span at the source's end.
    assert HtmlDocument("<i>Two men</i>").render([target], [[*words, (11, 12, 7, 7)]]) == "<i>Zwei Männer.</i>"
    assert HtmlDocument("<i>Two men</i>.").render([target], [[*words, (11, 12, 8, 8)]]) == "<i>Zwei Männer</i>."


def _random_fragment(rng: random.Random) -> str:
    """Blocks of words with (nested) inline elements around whole words."""

    def phrase(depth: int) -> str:
        out = []
        for _ in range(rng.randint(1, 4)):
            if depth < 3 and rng.random() < 0.35:
                tag = rng.choice(["b", "i", "em", "a", "span"])
                attr = ' href="x"' if tag == "a" else ""
                out.append(f"<{tag}{attr}>{phrase(depth + 1)}</{tag}>")
            else:
                out.append(rng.choice(["a", "dog", "runs", "in", "the", "park", "two", "men", "play"]))
        return " ".join(out)

    return "\n".join(f"<{b}>{phrase(0)}.</{b}>" for b in rng.choices(["p", "div", "li"], k=rng.randint(1, 3)))


def _tokens(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in re.finditer(r"\w+|[^\w\s]", text)]


def test_an_identity_translation_gives_the_fragment_back() -> None:
    rng = random.Random(0)
    for _ in range(300):
        fragment = _random_fragment(rng)
        doc = HtmlDocument(fragment)
        assert doc.render(doc.texts, [[(a, b, a, b) for a, b in _tokens(t)] for t in doc.texts]) == fragment


def test_any_word_order_and_unlinked_words_keep_the_markup_whole_and_well_nested() -> None:
    rng = random.Random(1)
    for _ in range(300):
        doc = HtmlDocument(fragment := _random_fragment(rng))
        translations, links = [], []
        for text in doc.texts:  # the words shuffled; some linked to </s> only
            out, run = "", []
            for s0, s1 in rng.sample(_tokens(text), k=len(_tokens(text))):
                out += " " * bool(out)
                run.append((len(out), len(out) + s1 - s0, *((s0, s1) if rng.random() > 0.15 else (len(text),) * 2)))
                out += text[s0:s1]
            translations.append(out)
            links.append(run)
        rendered = doc.render(translations, links)
        assert sorted(re.findall(r"<[^>]+>", rendered)) == sorted(re.findall(r"<[^>]+>", fragment))
        assert re.sub(r"<[^>]+>", "", rendered) == re.sub(r"<[^>]+>", "", doc.render(translations))
        stack = []
        for closing, tag in re.findall(r"<(/?)(\w+)[^>]*>", rendered):
            if closing:
                assert stack.pop() == tag, rendered
            else:
                stack.append(tag)
        assert not stack


def test_content_not_to_translate_comes_back_verbatim_in_place() -> None:
    # translate="no" and class="notranslate" inside a sentence: the model reads the words (their sense is
    # the sentence's), the output has them as written, where the alignment puts them.
    for attrs in ('translate="no"', 'class="brand notranslate"'):
        doc = HtmlDocument(f"<p>We use <span {attrs}>Acme <b>Cloud</b></span> for storage.</p>")
        source = "We use Acme Cloud for storage."
        assert doc.texts == [source]
        target = "Wir nutzen Akme Wolke für Speicher."
        out = doc.render([target], [links(source, target, [("Akme", "Acme"), ("Wolke", "Cloud"), ("Wir", "We")])])
        assert out == f"<p>Wir nutzen <span {attrs}>Acme <b>Cloud</b></span> für Speicher.</p>"


def test_a_block_not_to_translate_and_ignored_tags_are_kept_as_they_are() -> None:
    doc = HtmlDocument(
        '<div translate="no"><p>Keep <b>this</b> &amp; that.</p><br></div><p>A dog.</p><x>Acme</x> runs.',
        ignore_tags=frozenset({"x"}),
    )
    assert doc.texts == ["A dog.", "runs."]
    out = doc.render(["Ein Hund.", "rennt."])
    assert out == '<div translate="no"><p>Keep <b>this</b> &amp; that.</p><br></div><p>Ein Hund.</p><x>Acme</x> rennt.'


def test_a_line_break_is_inline_and_does_not_cut_the_sentence() -> None:
    doc = HtmlDocument("<p>A man in a red<br>shirt sings.</p>")
    source = "A man in a red shirt sings."
    assert doc.texts == [source]
    target = "Ein Mann in einem roten Hemd singt."
    pairs = [("Ein", "A"), ("Mann", "man"), ("roten", "red"), ("Hemd", "shirt"), ("singt", "sings")]
    out = doc.render([target], [links(source, target, pairs)])
    assert out == "<p>Ein Mann in einem roten <br>Hemd singt.</p>"
    assert HtmlDocument("<p>A red<br/>shirt.</p>").texts == ["A red shirt."]  # self-closed alike
    assert HtmlDocument("A super<wbr>market and a<img src=x>dog.").texts == ["A supermarket and adog."]


# Markup of every kind a client may send, well formed or not, between numbered words.
PIECES = [
    "<b>", "</b>", "<i>", "</i>", "<p>", "</p>", "<br>", "<img src=x>", '<span translate="no">', "</span>",
    "<script>", "</script>", "<style>", "</style>", "<code>", "</code>", "<!--", "-->", "<!-- c -->",
    "<![CDATA[", "]]>", "<!DOCTYPE html>", "<?x?>", "<", ">", "&amp;", "&lt;", "&", " ", " ", "\n", "<b", "<!",
]  # fmt: skip


@hypothesis.settings(max_examples=400, deadline=None, derandomize=True)
@hypothesis.given(st.lists(st.one_of(st.sampled_from(PIECES), st.just("WORD")), max_size=30))
def test_no_word_of_an_accepted_fragment_is_lost_or_invented(pieces: list[str]) -> None:
    """Whatever the markup, each word comes back translated (upper-cased here) or kept as written, and
    nothing else appears; or the fragment is refused (422) for ending inside markup."""
    n = iter(range(len(pieces)))
    fragment = "".join(f" w{next(n)} " if p == "WORD" else p for p in pieces)
    try:
        doc = HtmlDocument(fragment)
    except HtmlSyntaxError:
        return
    # Upper-casing keeps every character in place: each token linked to itself.
    rendered = doc.render([t.upper() for t in doc.texts], [[(a, b, a, b) for a, b in _tokens(t)] for t in doc.texts])
    sent = re.findall(r"w\d+", fragment)
    got = re.findall(r"[wW]\d+", rendered)
    assert sorted(w.lower() for w in got) == sorted(sent), (fragment, rendered)


def test_an_unclosed_script_or_style_keeps_its_content_and_cdata_comes_back_whole() -> None:
    doc = HtmlDocument("A man <script> rides a bike.")  # the script runs to the end, as a browser reads it
    assert doc.texts == ["A man"] and doc.render(["Ein Mann"]) == "Ein Mann <script> rides a bike."
    doc = HtmlDocument("<![CDATA[A man]]> rides.")
    assert doc.texts == ["rides."] and doc.render(["fährt."]) == "<![CDATA[A man]]> fährt."


@pytest.mark.parametrize(
    ("fragment", "where"),
    [
        ("A <!-- a comment never closed", "'<!-- a comment never' at character 2"),
        ("A dog runs. <b", "'<b' at character 12"),
    ],
)
def test_a_fragment_that_ends_inside_markup_is_refused_saying_where(fragment: str, where: str) -> None:
    with pytest.raises(HtmlSyntaxError, match=re.escape(where)):
        HtmlDocument(fragment)
    assert HtmlDocument("I <3 you, a < b").texts == ["I <3 you, a < b"]  # a '<' that starts no markup is text


def test_inline_elements_nest_up_to_the_limit_and_not_one_deeper() -> None:
    deep = "<b>" * MAX_DEPTH + "A dog." + "</b>" * MAX_DEPTH
    assert HtmlDocument(deep).texts == ["A dog."]
    with pytest.raises(HtmlLimitError, match=f"more than {MAX_DEPTH} deep"):
        HtmlDocument("<i>" + deep + "</i>")
