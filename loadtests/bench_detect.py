"""Language detection accuracy on Multi30k's test sets: every English, German and French sentence of
test_2016_flickr identified among the three languages (what a server serving en, de and fr detects
among), overall and for sentences of five words or more, with the time per sentence.

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
from service.detect import LanguageDetector

LANGUAGES = ("en", "de", "fr")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.environ.get("BEAMSERVE_DATA", "../shared/data/multi30k"))
    p.add_argument("--out", type=Path, default=None, help="also write the report here (markdown)")
    args = p.parse_args()
    detector = LanguageDetector(LANGUAGES)
    rows = [
        "| language | sentences | right | of 5+ words | right | first 3 words only: right | µs per sentence |",
        "|---|---|---|---|---|---|---|",
    ]
    totals: Counter[str] = Counter()
    for lang in LANGUAGES:
        with gzip.open(Path(args.data) / f"test_2016_flickr.{lang}.gz", "rt", encoding="utf-8") as f:
            sentences = [line.strip() for line in f if line.strip()]
        start = time.perf_counter()
        found = [d.language for d in detector.detect(sentences)]
        per = (time.perf_counter() - start) / len(sentences) * 1e6
        long = [i for i, s in enumerate(sentences) if len(s.split()) >= 5]
        right = sum(f == lang for f in found)
        right_long = sum(found[i] == lang for i in long)
        # A harder case: the first three words alone, as a short post or a title would be.
        short = sum(d.language == lang for d in detector.detect([" ".join(s.split()[:3]) for s in sentences]))
        totals.update(n=len(sentences), right=right, long=len(long), right_long=right_long, short=short)
        rows.append(
            f"| {lang} | {len(sentences)} | {right / len(sentences):.2%} | {len(long)} | "
            f"{right_long / len(long):.2%} | {short / len(sentences):.2%} | {per:.0f} |"
        )
        for i, (f, s) in enumerate(zip(found, sentences, strict=True)):
            if f != lang:
                print(f"  {lang} line {i + 1} taken as {f}: {s}", flush=True)
    rows.append(
        f"| all | {totals['n']} | {totals['right'] / totals['n']:.2%} | {totals['long']} | "
        f"{totals['right_long'] / totals['long']:.2%} | {totals['short'] / totals['n']:.2%} | |"
    )
    emit("\n".join(rows), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
