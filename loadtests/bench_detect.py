"""Language detection accuracy with a server's view of it (service/text/detect.py, serving en, de and fr):
every English, German and French sentence of Multi30k's test_2016_flickr, overall, for sentences of
five words or more and for their first three words alone, and how many were taken for a language no
model serves; then the sentences of tests/data/detect (Spanish, Italian, Dutch, Polish, Portuguese,
written for this repository): how many are named as unserved, and how many taken for a served one;
and short texts, each sentence's first 1 to 5 words: how often the language is right, how often it is
right and sure (ranked at least ECHO_MIN: a text sent to its own language comes back as it is), and how
often it is unsure (under ECHO_MIN: sent to the language detected, 400 ambiguous_source, never an echo).

    python loadtests/bench_detect.py [--data ../shared/data/multi30k]
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtests.reports import emit
from service.text.detect import ECHO_MIN, LanguageDetector

LANGUAGES = ("en", "de", "fr")
UNSERVED = ("es", "it", "nl", "pl", "pt")
UNSERVED_DIR = Path(__file__).resolve().parents[1] / "tests" / "data" / "detect"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.environ.get("BEAMSERVE_DATA", "../shared/data/multi30k"))
    p.add_argument("--out", type=Path, default=None, help="also write the report here (markdown)")
    args = p.parse_args()
    detector = LanguageDetector(LANGUAGES)
    rows = [
        "| language | sentences | right | of 5+ words | right | taken as unserved | first 3 words: right "
        "| first 3 words: taken as unserved | µs per sentence |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    totals: Counter[str] = Counter()
    for lang in LANGUAGES:
        with gzip.open(Path(args.data) / f"test_2016_flickr.{lang}.gz", "rt", encoding="utf-8") as f:
            sentences = [line.strip() for line in f if line.strip()]
        start = time.perf_counter()
        found = detector.detect(sentences)
        per = (time.perf_counter() - start) / len(sentences) * 1e6
        long = [i for i, s in enumerate(sentences) if len(s.split()) >= 5]
        right = sum(d.language == lang for d in found)
        right_long = sum(found[i].language == lang for i in long)
        unserved = sum(not d.served for d in found)
        # A harder case: the first three words alone, as a short post or a title would be.
        heads = detector.detect([" ".join(s.split()[:3]) for s in sentences])
        short, short_unserved = sum(d.language == lang for d in heads), sum(not d.served for d in heads)
        totals.update(
            n=len(sentences),
            right=right,
            long=len(long),
            right_long=right_long,
            unserved=unserved,
            short=short,
            short_unserved=short_unserved,
        )
        rows.append(
            f"| {lang} | {len(sentences)} | {right / len(sentences):.2%} | {len(long)} | "
            f"{right_long / len(long):.2%} | {unserved} | {short / len(sentences):.2%} | {short_unserved} | {per:.0f} |"
        )
        for i, (d, s) in enumerate(zip(found, sentences, strict=True)):
            if d.language != lang:
                print(f"  {lang} line {i + 1} taken as {d.language}: {s}", flush=True)
    n = totals["n"]
    rows.append(
        f"| all | {n} | {totals['right'] / n:.2%} | {totals['long']} | {totals['right_long'] / totals['long']:.2%} | "
        f"{totals['unserved']} | {totals['short'] / n:.2%} | {totals['short_unserved']} | |"
    )
    rows += [
        "",
        "| language (not served) | sentences | named, its own code | named, another unserved code "
        "| taken for a served language | first 3 words: taken for a served language |",
        "|---|---|---|---|---|---|",
    ]
    for lang in UNSERVED:
        sentences = (UNSERVED_DIR / f"{lang}.txt").read_text(encoding="utf-8").splitlines()
        found = detector.detect(sentences)
        own = sum(d.language == lang and not d.served for d in found)
        other = sum(d.language != lang and not d.served for d in found)
        heads = detector.detect([" ".join(s.split()[:3]) for s in sentences])
        rows.append(
            f"| {lang} | {len(sentences)} | {own} | {other} | {sum(d.served for d in found)} | "
            f"{sum(d.served for d in heads)} |"
        )
        for d, s in zip(found, sentences, strict=True):
            if d.served or d.language != lang:
                print(f"  {lang} taken as {d.language} ({'served' if d.served else 'unserved'}): {s}", flush=True)
    rows += [
        "",
        f"| words (each sentence's first n) | texts | right | right and sure (>= {ECHO_MIN:.0%}) "
        "| unsure: refused when sent to the language detected | wrong and sure: answered as already there |",
        "|---|---|---|---|---|---|",
    ]
    for n in range(1, 6):
        texts, langs = [], []
        for lang in LANGUAGES:
            with gzip.open(Path(args.data) / f"test_2016_flickr.{lang}.gz", "rt", encoding="utf-8") as f:
                heads = [" ".join(line.split()[:n]) for line in f if len(line.split()) >= n]
            texts += heads
            langs += [lang] * len(heads)
        found = detector.detect(texts)
        right = sum(d.language == lang for d, lang in zip(found, langs, strict=True))
        sure = sum(d.language == lang and not d.ambiguous for d, lang in zip(found, langs, strict=True))
        unsure = sum(d.ambiguous for d in found)
        wrong_sure = sum(d.language != lang and not d.ambiguous for d, lang in zip(found, langs, strict=True))
        total = len(texts)
        rows.append(
            f"| {n} | {total} | {right / total:.2%} | {sure / total:.2%} | {unsure / total:.2%} | "
            f"{wrong_sure / total:.2%} |"
        )
    emit("\n".join(rows), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
