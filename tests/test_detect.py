"""Language detection (service/detect.py) on the shipped Multi30k slices and its edge cases."""

from __future__ import annotations

from service.detect import LanguageDetector

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
