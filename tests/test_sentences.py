"""service.sentences: paragraphs split into the sentences the models were trained on, and joined back."""

from __future__ import annotations

import pytest

from service.sentences import join_sentences, join_translations, split_sentences

from .conftest import read_lines


@pytest.mark.parametrize(
    ("text", "sentences"),
    [
        (
            'A dog runs. Two men sit on a bench!  "Why?" she asked.',
            ["A dog runs.", "Two men sit on a bench!", '"Why?" she asked.'],
        ),
        ("Dr. Who meets Mr. Smith. They talk.", ["Dr. Who meets Mr. Smith.", "They talk."]),
        (
            "A sign says E.S.E. Electronics. J. Smith reads it.",
            ["A sign says E.S.E. Electronics.", "J. Smith reads it."],
        ),
        ("First line\nSecond line.\n\nThird.", ["First line", "Second line.", "Third."]),
        ("It costs 5 dollars. 10 people came.", ["It costs 5 dollars.", "10 people came."]),
        ("Wait... What? no, it is fine.", ["Wait...", "What? no, it is fine."]),
        ("  One sentence only.  ", ["  One sentence only.  "]),  # a single sentence is the text as it came
        ("   ", ["   "]),
        (" A dog runs.\nIt barks. ", [" A dog runs.", "It barks. "]),
    ],
)
def test_split_finds_sentence_boundaries_and_joins_back_losslessly(text: str, sentences: list[str]) -> None:
    got, separators = split_sentences(text)
    assert got == sentences
    assert join_sentences(got, separators) == text


def test_the_test_sets_single_sentences_are_left_whole() -> None:
    # What the service's equivalence with the library rests on: one caption, one sentence.
    for split in ("test_2016_flickr", "val"):
        for line in read_lines(f"{split}.en.gz"):
            assert split_sentences(line)[0] == [line], line


def test_nbest_of_a_paragraph_joins_each_rank_and_averages_scores() -> None:
    nbest = [[("Ein Hund.", -0.5), ("Hund.", -1.0)], [("Zwei Männer.", -0.25)]]
    assert join_translations(nbest, [" "]) == [("Ein Hund. Zwei Männer.", -0.375), ("Hund. Zwei Männer.", -0.625)]
    assert join_translations(nbest[:1], []) == nbest[0]  # one sentence: its own list
