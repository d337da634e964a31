"""service.text.sentences: paragraphs split into the sentences the models were trained on, and joined back."""

from __future__ import annotations

import random
import re

import pytest

from service.text.sentences import (
    _BOUNDARY,
    _MAY_CUT,
    MAX_UNMARKED,
    join_sentences,
    join_translations,
    split_sentences,
)

from .conftest import read_lines

# (language, text, its sentences): decimals, versions, times, initials, abbreviations, ordinals, quotes and
# brackets, ellipses, lists, CJK full stops, line breaks. loadtests/bench_splitter.py scores libraries on it.
CASES: list[tuple[str, str, list[str]]] = [
    ("en", "It costs 3.50. Then we left.", ["It costs 3.50.", "Then we left."]),
    ("en", "Version 2.1.3. Next we update.", ["Version 2.1.3.", "Next we update."]),
    ("en", "We met at 5 p.m. He left early.", ["We met at 5 p.m.", "He left early."]),
    ("en", "She moved to the U.S. Next year she returns.", ["She moved to the U.S.", "Next year she returns."]),
    ("en", "The U.S. Army arrived.", ["The U.S. Army arrived."]),
    ("en", "Dr. Who meets Mr. Smith. They talk.", ["Dr. Who meets Mr. Smith.", "They talk."]),
    ("en", "J. R. R. Tolkien wrote it. It is long.", ["J. R. R. Tolkien wrote it.", "It is long."]),
    (
        "en",
        "A sign says E.S.E. Electronics. J. Smith reads it.",
        ["A sign says E.S.E. Electronics.", "J. Smith reads it."],
    ),
    ("en", "Bring pens, paper, etc. The rest is here.", ["Bring pens, paper, etc.", "The rest is here."]),
    ("en", "Fruit, e.g. apples, is sold here.", ["Fruit, e.g. apples, is sold here."]),
    ("en", "See Fig. 3 for details. It shows the loop.", ["See Fig. 3 for details.", "It shows the loop."]),
    ("en", "He works at Acme Inc. The firm is small.", ["He works at Acme Inc.", "The firm is small."]),
    ("en", "It was 1999. Then the war came.", ["It was 1999.", "Then the war came."]),
    ("en", "The pi is 3.14159 roughly. Nobody knows more.", ["The pi is 3.14159 roughly.", "Nobody knows more."]),
    ("en", 'He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
    ("en", '"Stop!" he said. We stopped.', ['"Stop!" he said.', "We stopped."]),
    ("en", "It rained (a lot.) We stayed in.", ["It rained (a lot.)", "We stayed in."]),
    ("en", "Wait... Then it started.", ["Wait...", "Then it started."]),
    ("en", "Wait... and then it started.", ["Wait... and then it started."]),
    ("en", "Really?! Yes, really.", ["Really?!", "Yes, really."]),
    ("en", "Steps: 1. Open the box. 2. Take the lid off.", ["Steps: 1. Open the box.", "2. Take the lid off."]),
    ("en", "First line\nSecond line.\n\nThird.", ["First line", "Second line.", "Third."]),
    ("en", "It costs 5 dollars. 10 people came.", ["It costs 5 dollars.", "10 people came."]),
    ("en", "Visit example.com today. It is free.", ["Visit example.com today.", "It is free."]),
    ("en", "Mail bob@example.com. He answers fast.", ["Mail bob@example.com.", "He answers fast."]),
    ("en", "I met Prof. Adams. She was kind.", ["I met Prof. Adams.", "She was kind."]),
    ("en", "Plan B. Then we go home.", ["Plan B.", "Then we go home."]),
    ("en", "We left at 9 a.m. and came back.", ["We left at 9 a.m. and came back."]),
    ("de", "Er kam am 3. Mai. Dann ging er.", ["Er kam am 3. Mai.", "Dann ging er."]),
    ("de", "Das ist z. B. ein Haus. Es ist alt.", ["Das ist z. B. ein Haus.", "Es ist alt."]),
    ("de", "Das ist z.B. ein Haus. Es ist alt.", ["Das ist z.B. ein Haus.", "Es ist alt."]),
    ("de", "Hr. Müller kommt. Fr. Schmidt auch.", ["Hr. Müller kommt.", "Fr. Schmidt auch."]),
    (
        "de",
        "Er wohnt in der Hauptstr. 5 in Berlin. Sie nicht.",
        ["Er wohnt in der Hauptstr. 5 in Berlin.", "Sie nicht."],
    ),
    (
        "de",
        "Der 2. Weltkrieg endete 1945. Danach kam der Frieden.",
        ["Der 2. Weltkrieg endete 1945.", "Danach kam der Frieden."],
    ),
    ("de", "Es kostet 3,50 €. Das ist billig.", ["Es kostet 3,50 €.", "Das ist billig."]),
    ("de", "Äpfel, Birnen usw. Die Auswahl ist groß.", ["Äpfel, Birnen usw.", "Die Auswahl ist groß."]),
    ("de", "Siehe Nr. 7 im Katalog. Er ist neu.", ["Siehe Nr. 7 im Katalog.", "Er ist neu."]),
    ("de", "„Komm!“ Sie kam sofort.", ["„Komm!“", "Sie kam sofort."]),
    ("de", "Das war am 24.12.2025. Heute ist es kalt.", ["Das war am 24.12.2025.", "Heute ist es kalt."]),
    ("de", "Vgl. Abschnitt 4. Dort steht es.", ["Vgl. Abschnitt 4.", "Dort steht es."]),
    ("fr", "M. Dupont est arrivé. Il est content.", ["M. Dupont est arrivé.", "Il est content."]),
    ("fr", "Mme Martin parle. Elle rit.", ["Mme Martin parle.", "Elle rit."]),
    ("fr", "Il coûte 3,50 €. C'est cher.", ["Il coûte 3,50 €.", "C'est cher."]),
    ("fr", "« Viens ! » Elle est venue.", ["« Viens ! »", "Elle est venue."]),
    ("fr", "Des fruits, p.ex. des pommes, sont là.", ["Des fruits, p.ex. des pommes, sont là."]),
    ("fr", "Il est parti à 5 h. Nous sommes restés.", ["Il est parti à 5 h.", "Nous sommes restés."]),
    ("fr", "Pourquoi ? Parce que.", ["Pourquoi ?", "Parce que."]),
    ("ja", "今日は晴れです。明日は雨です。", ["今日は晴れです。", "明日は雨です。"]),
    ("zh", "我爱你。你爱我吗？我不知道！", ["我爱你。", "你爱我吗？", "我不知道！"]),
    ("ja", "「行こう。」彼は言った。", ["「行こう。」", "彼は言った。"]),
    # Other scripts' sentence terminals (and their full stops): each split as a reader of the language would.
    ("hi", "मैं घर जा रहा हूँ। बारिश हो रही है। तुम कहाँ हो?", ["मैं घर जा रहा हूँ।", "बारिश हो रही है।", "तुम कहाँ हो?"]),
    ("mr", "मी घरी जातो। पाऊस पडत आहे।", ["मी घरी जातो।", "पाऊस पडत आहे।"]),
    ("bn", "আমি বাড়ি যাচ্ছি। বৃষ্টি হচ্ছে।", ["আমি বাড়ি যাচ্ছি।", "বৃষ্টি হচ্ছে।"]),
    ("ar", "هل أنت بخير؟ أنا بخير. شكرا لك.", ["هل أنت بخير؟", "أنا بخير.", "شكرا لك."]),
    ("ur", "میں گھر جا رہا ہوں۔ بارش ہو رہی ہے۔", ["میں گھر جا رہا ہوں۔", "بارش ہو رہی ہے۔"]),
    ("fa", "من به خانه می‌روم. باران می‌بارد؟ بله.", ["من به خانه می‌روم.", "باران می‌بارد؟", "بله."]),
    ("hy", "Ես գնում եմ տուն։ Անձրև է գալիս։", ["Ես գնում եմ տուն։", "Անձրև է գալիս։"]),
    ("am", "ወደ ቤት እሄዳለሁ። ዝናብ እየዘነበ ነው።", ["ወደ ቤት እሄዳለሁ።", "ዝናብ እየዘነበ ነው።"]),
    ("my", "ကျွန်တော် စာဖတ်တယ်၊ ပြီးတော့ အိပ်တယ်။ မိုးရွာနေတယ်။", ["ကျွန်တော် စာဖတ်တယ်၊ ပြီးတော့ အိပ်တယ်။", "မိုးရွာနေတယ်။"]),
    ("km", "ខ្ញុំទៅផ្ទះ។ភ្លៀងកំពុងធ្លាក់។", ["ខ្ញុំទៅផ្ទះ។", "ភ្លៀងកំពុងធ្លាក់។"]),
    ("ru", "Я иду домой. Идёт дождь. Где ты?", ["Я иду домой.", "Идёт дождь.", "Где ты?"]),
    ("el", "Πάω σπίτι. Βρέχει.", ["Πάω σπίτι.", "Βρέχει."]),
    ("he", "אני הולך הביתה. יורד גשם.", ["אני הולך הביתה.", "יורד גשם."]),
]


@pytest.mark.parametrize(("lang", "text", "sentences"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_split_table(lang: str, text: str, sentences: list[str]) -> None:
    got, separators = split_sentences(text, lang)
    assert [g.strip() for g in got] == sentences
    assert join_sentences(got, separators) == text


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


def test_paragraphs_of_test_set_sentences_split_into_exactly_those_sentences() -> None:
    # No sentence lost or merged: captions (each one sentence) joined by random whitespace come back one by one.
    rng = random.Random(0)
    for lang in ("en", "de"):
        captions = [c for c in read_lines(f"val.{lang}.gz") if c[-1] in ".!?"]
        for _ in range(300):
            picked = rng.sample(captions, rng.randint(2, 8))
            text = "".join(c + rng.choice([" ", "  ", "\n", " \n ", "\n\n"]) for c in picked).rstrip()
            got, separators = split_sentences(text, lang)
            assert [g.strip() for g in got] == picked
            assert join_sentences(got, separators) == text


def test_split_then_join_is_the_identity_on_random_text() -> None:
    rng = random.Random(1)
    alphabet = "aZé1 .!?…。！？\n\t\"'“”„«»()[]-,:;€$%{}@/" + "xyz" * 4
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        got, separators = split_sentences(text, rng.choice(["en", "de", "fr", ""]))
        assert join_sentences(got, separators) == text, repr(text)
        assert all(g.strip() for g in got) or len(got) == 1, repr(text)  # no empty sentence between two cuts


def test_the_stops_are_unicode_s_sentence_terminals() -> None:
    """LATIN_STOPS, CJK_STOPS and OTHER_STOPS together are the Sentence_Terminal characters of the `regex`
    package's Unicode, less the two left out on purpose (a new Unicode adds to them: update the lists)."""
    import regex

    from service.text import sentences

    def chars(cls: str) -> set[str]:
        return {chr(c) for c in range(0x110000) if re.fullmatch(f"[{cls}]", chr(c))}

    terminals = {chr(c) for c in range(0x110000) if regex.fullmatch(r"\p{Sentence_Terminal}", chr(c))}
    ours = chars(sentences.LATIN_STOPS) | chars(sentences.CJK_STOPS) | chars(sentences.OTHER_STOPS)
    assert ours == terminals - {"\u104a", "\u2024"} | {"\u2026"}  # the ellipsis ends a sentence too


def test_a_long_run_of_thai_is_cut_at_spaces_within_the_bound() -> None:
    thai = "วันนี้อากาศดีมาก เราไปเที่ยวทะเลกัน เด็กๆ เล่นน้ำอย่างสนุกสนาน ส่วนผู้ใหญ่นั่งพักใต้ต้นไม้ "
    text = (thai * 6).strip()
    got, separators = split_sentences(text, "th")
    assert len(got) > 1 and all(len(g) <= MAX_UNMARKED for g in got), [len(g) for g in got]
    assert set(separators) == {" "} and join_sentences(got, separators) == text
    short = "วันนี้อากาศดีมาก เราไปเที่ยวทะเลกัน"
    assert split_sentences(short, "th") == ([short], [])  # under the bound: whole


def test_a_text_without_a_possible_cut_has_no_boundary() -> None:
    """split_sentences answers a body without any of _MAY_CUT's characters (before its last one) whole,
    without the boundary search: on random text the search finds nothing there either."""
    rng = random.Random(3)
    alphabet = "aZé1 .!?…。！？\n\t\"'“”„«»()[]-,:;€$%{}@/" + "xyz" * 4
    skipped = 0
    for _ in range(20000):
        body = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))).strip()
        if _MAY_CUT.search(body, 0, len(body) - 1) is None:
            skipped += 1
            assert _BOUNDARY.search(body) is None, repr(body)
    assert skipped > 1000  # the random texts reach the quick path
