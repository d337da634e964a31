"""Sentence splitters side by side: beamserve's (service/text/sentences.py), pysbd and sentencex.

    python loadtests/bench_splitter.py --out runs/bench/splitter.md

- Accuracy on the splitter table of tests/test_sentences.py (English, German, French, Japanese,
  Chinese): a case counts when the sentences, stripped, are exactly the expected ones.
- Lossless: whether joining the pieces gives back the text (beamserve keeps separators apart; for the
  libraries, whether their pieces concatenate to the text).
- Time against text length: paragraphs of Multi30k captions (tests/data) of 1,000 to 32,000
  characters, milliseconds per text (best of 5); linear time means the ratio per 1,000 characters
  stays flat.

pysbd and sentencex are not dependencies of beamserve: `pip install pysbd sentencex` to run this.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from reports import emit  # noqa: E402

from service.text.sentences import split_sentences  # noqa: E402
from tests.conftest import read_lines  # noqa: E402
from tests.test_sentences import CASES  # noqa: E402

Splitter = Callable[[str, str], list[str]]


def splitters() -> dict[str, Splitter]:
    import pysbd
    import sentencex

    segmenters: dict[str, pysbd.Segmenter] = {}

    def with_pysbd(text: str, lang: str) -> list[str]:
        code = lang if lang in ("en", "de", "fr", "ja", "zh") else "en"
        seg = segmenters.setdefault(code, pysbd.Segmenter(language=code, clean=False))
        return list(seg.segment(text))

    def with_sentencex(text: str, lang: str) -> list[str]:
        return list(sentencex.segment(lang, text))

    def with_beamserve(text: str, lang: str) -> list[str]:
        sentences, separators = split_sentences(text, lang)
        return [s + sep for s, sep in zip(sentences, [*separators, ""], strict=True)]

    return {"beamserve": with_beamserve, "pysbd": with_pysbd, "sentencex": with_sentencex}


def paragraph(chars: int, rng: random.Random, captions: list[str]) -> str:
    out: list[str] = []
    while sum(map(len, out)) < chars:
        out.append(rng.choice(captions) + " ")
    return "".join(out)[:chars]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    rng = random.Random(0)
    captions = read_lines("val.en.gz")
    lengths = [1000, 2000, 4000, 8000, 16000, 32000]
    texts = {n: paragraph(n, rng, captions) for n in lengths}
    rows = []
    for name, split in splitters().items():
        right, lossless, wrong = 0, 0, []
        for lang, text, expected in CASES:
            pieces = split(text, lang)
            lossless += "".join(pieces) == text
            if [s.strip() for s in pieces if s.strip()] == expected:
                right += 1
            else:
                wrong.append(text)
        times = []
        for n in lengths:
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                split(texts[n], "en")
                best = min(best, time.perf_counter() - t0)
            times.append(best * 1000)
        rows.append((name, right, lossless, times, wrong))
        print(f"{name}: {right}/{len(CASES)} right, {lossless} lossless", file=sys.stderr, flush=True)
    lines = [
        f"Splitter table ({len(CASES)} cases, tests/test_sentences.py) and time per paragraph of Multi30k "
        "captions (`python loadtests/bench_splitter.py`):",
        "",
        "| splitter | cases right | lossless | "
        + " | ".join(f"ms, {n:,} chars" for n in lengths)
        + " | ms per 1,000 chars at 1k / 32k |",
        "|---|---:|---:|" + "---:|" * len(lengths) + "---|",
    ]
    for name, right, lossless, times, _ in rows:
        per = f"{times[0] / (lengths[0] / 1000):.2f} / {times[-1] / (lengths[-1] / 1000):.2f}"
        lines.append(
            f"| {name} | {right}/{len(CASES)} | {lossless}/{len(CASES)} | "
            + " | ".join(f"{t:.2f}" for t in times)
            + f" | {per} |"
        )
    lines.append("")
    for name, _, _, _, wrong in rows:
        if wrong:
            lines.append(f"{name} missed: " + "; ".join(f"`{w!r}`" for w in wrong[:12]))
            lines.append("")
    report = "\n".join(lines)
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
