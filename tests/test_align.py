"""Alignment from cross-attention on the shipped en-de model, and the tokenizer's character spans under it."""

from __future__ import annotations

import pytest

from model import InvalidTextError, Translator


@pytest.fixture(scope="module")
def tr() -> Translator:
    return Translator.load("en-de", "cpu", num_threads=2)


@pytest.mark.parametrize("text", ["Ünïcödé  ça va? A dog\u2019s ball.", ">>de<< A dog.", "  A  dog ", "A 🐕 x"])
def test_spans_give_encode_s_ids_and_each_token_s_characters(tr: Translator, text: str) -> None:
    ids, spans = tr.tokenizer.spans(text)
    assert ids == tr.encode(text)[:-1]
    pieces = [tr.tokenizer.pieces[i].lstrip("\u2581") for i in ids]
    for (a, b), piece in zip(spans, pieces, strict=True):
        assert text[a:b] in (piece, "") or piece == "<unk>", (text[a:b], piece)
    assert [b for _, b in spans] == sorted(b for _, b in spans)
    ids, spans = tr.tokenizer.spans("Ein Hund läuft.", target=True)
    assert ids == tr.tokenizer.encode_target("Ein Hund läuft.")[:-1] and spans[1] == (4, 8)


def test_content_words_link_to_their_translations(tr: Translator) -> None:
    pairs = [
        ("A man in a red shirt is riding a bike.", "Ein Mann in einem roten Hemd fährt Fahrrad."),
        ("Two dogs play in the snow.", "Zwei Hunde spielen im Schnee."),
    ]
    words = []
    for (src, tgt), links in zip(pairs, tr.align(pairs), strict=True):
        words.append({tgt[slice(*link.target)]: src[slice(*link.source)] for link in links})
    assert {k: words[0][k] for k in ("Mann", "roten", "Hemd", "fährt", "Fahrrad")} == {
        "Mann": "man",
        "roten": "red",
        "Hemd": "shirt",
        "fährt": "riding",
        "Fahrrad": "bike",
    }
    assert {k: words[1][k] for k in ("Zwei", "Hunde", "spielen", "Schnee")} == {
        "Zwei": "Two",
        "Hunde": "dogs",
        "spielen": "play",
        "Schnee": "snow",
    }


def test_a_padded_batch_aligns_as_each_pair_alone(tr: Translator) -> None:
    pairs = [
        ("A dog.", "Ein Hund."),
        ("", "Nichts"),
        ("A woman with a blue hat sings on a stage.", "Eine Frau mit einem blauen Hut singt auf einer Bühne."),
    ]
    together = tr.align(pairs)
    assert together[1] == [] and together == [tr.align([p])[0] for p in pairs]
    assert len(together[2]) == 11  # every target token but none of the lone word boundaries


def test_text_that_is_not_unicode_is_refused_naming_the_pair(tr: Translator) -> None:
    with pytest.raises(InvalidTextError, match=r"texts\[1\]"):
        tr.align([("A dog.", "Ein Hund."), ("A \ud800.", "Ein Hund.")])
