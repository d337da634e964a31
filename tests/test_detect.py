"""Language detection (service/text/detect.py) on the shipped Multi30k slices, on sentences in languages the
server does not serve (tests/data/detect), and its edge cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.text.detect import LanguageDetector

from .conftest import read_lines


def test_every_shipped_sentence_is_identified_among_the_served_languages() -> None:
    detector = LanguageDetector(["en", "de", "fr"])
    english, german = read_lines("test_2016_flickr.en.gz", 300), read_lines("val.de.gz", 300)
    found = [d.language for d in detector.detect(english + german)]
    assert found == ["en"] * 300 + ["de"] * 300


def test_a_text_without_letters_goes_with_the_majority_at_confidence_zero() -> None:
    detector = LanguageDetector(["en", "de", "fr"])
    found = detector.detect(["Ein Hund läuft.", "2024", "Zwei Männer spielen Fußball.", ""])
    assert [d.language for d in found] == ["de"] * 4
    assert found[1].confidence == 0.0 and found[3].confidence == 0.0 and found[0].confidence > 0.5


def test_markup_is_not_evidence() -> None:
    detector = LanguageDetector(["en", "de", "fr"])
    html = '<p class="headline"><a href="https://example.org/le-chat">Ein Hund</a> läuft &amp; springt.</p>'
    [found] = detector.detect([html], markup=True)
    assert found.language == "de"
    ranks = detector.rank(html, markup=True)
    assert ranks[0].language == "de" and abs(sum(r.confidence for r in ranks) - 1) < 0.01


def test_languages_the_identifier_does_not_know_are_left_out() -> None:
    detector = LanguageDetector(["en", "xx", "de"])
    assert detector.languages == ("en", "de")
    assert LanguageDetector(["xx"]).rank("A dog.") == []


UNSERVED_DIR = Path(__file__).parent / "data" / "detect"


@pytest.mark.parametrize("language", ["es", "it", "nl", "pl", "pt"])
def test_a_sentence_in_a_language_no_model_serves_is_named_never_taken_for_a_served_one(language: str) -> None:
    detector = LanguageDetector(["en", "de", "fr"])
    sentences = (UNSERVED_DIR / f"{language}.txt").read_text(encoding="utf-8").splitlines()
    found = detector.detect(sentences)
    assert not [s for s, d in zip(sentences, found, strict=True) if d.served]
    # Named by its own code but for at most one (a Spanish sentence py3langid calls Aragonese).
    assert sum(d.language == language for d in found) >= len(sentences) - 1


def test_served_sentences_and_their_first_words_are_never_taken_for_an_unserved_language() -> None:
    detector = LanguageDetector(["en", "de", "fr"])
    texts = read_lines("test_2016_flickr.en.gz", 300) + read_lines("val.de.gz", 300)
    heads = [" ".join(t.split()[:n]) for t in texts for n in (1, 2, 3, 5)]
    assert all(d.served for d in detector.detect(texts + heads))


def test_a_short_text_in_another_script_is_named_and_a_short_latin_one_keeps_the_served_ranking() -> None:
    detector = LanguageDetector(["en", "de", "fr"])
    russian, japanese, short = detector.detect(["Привет, как дела?", "日本語の文です。", "Ein Hund."])
    assert (russian.language, russian.served, japanese.language, japanese.served) == ("ru", False, "ja", False)
    assert (short.language, short.served) == ("de", True)


def test_a_text_ranked_unsure_is_marked_ambiguous_short_or_long() -> None:
    detector = LanguageDetector(["en", "de", "fr"])
    texts = ["Ein Mann und a woman sind in the park.", "Ein Mann und eine Frau sind im Park.", "Hotel", "Bonjour"]
    mixed, german, hotel, hello = detector.detect(texts)
    assert (mixed.language, mixed.ambiguous) == ("de", True) and mixed.confidence < 0.9
    assert (german.language, german.ambiguous) == ("de", False)
    assert (hotel.language, hotel.ambiguous) == ("de", True)  # a word of every language: not sure enough to echo
    assert (hello.language, hello.ambiguous) == ("fr", False) and hello.confidence >= 0.9
