"""How well a translation's confidence (model/decode/confidence.py: the geometric mean of its tokens'
probabilities, what /v1/translate answers) ranks sentences by quality: on Multi30k's held-out test sets,
its Spearman rank correlation with each sentence's chrF against the reference, and a reliability table
(sentences by confidence bin, their mean chrF), for each shipped pair.

    python loadtests/bench_confidence.py --out loadtests/results/confidence.md
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from reports import emit  # noqa: E402
from sacrebleu.metrics import CHRF  # noqa: E402

from model import Translator  # noqa: E402
from model.decode.confidence import confidence  # noqa: E402

BINS = [0.0, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0001]


def ranks(values: list[float]) -> list[float]:
    """Each value's rank, ties given their mean rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    return cov / (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5


def read(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.strip() for line in f]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.environ.get("BEAMSERVE_DATA", "../shared/data/multi30k"))
    p.add_argument("--sets", default="test_2016_flickr", help="held out: val chose the shipped models' checkpoints")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    chrf = CHRF()
    lines = ["# Confidence against sentence chrF", "", "| pair | test set | sentences | Spearman (confidence, chrF) |"]
    lines.append("|---|---|---:|---:|")
    tables = []
    for pair in ("en-de", "en-fr"):
        tr = Translator.load(pair, "cpu")
        for name in args.sets.split(","):
            src_path = Path(args.data) / f"{name}.en.gz"
            if not src_path.exists():
                continue
            sources, refs = read(src_path), read(Path(args.data) / f"{name}.{pair[3:]}.gz")
            print(f"{pair} {name}: {len(sources)} sentences", flush=True)
            out = tr.translate(sources, beam_size=4, max_batch_size=64)
            sure = [confidence(r.scores[0], len(r.token_ids[0]) + 1, 1.0) for r in out]
            quality = [chrf.sentence_score(r.hypotheses[0], [ref]).score for r, ref in zip(out, refs, strict=True)]
            lines.append(f"| {pair} | {name} | {len(sources)} | {spearman(sure, quality):.3f} |")
            rows = [f"| {pair} {name}: confidence | sentences | mean chrF |", "|---|---:|---:|"]
            for low, high in itertools.pairwise(BINS):
                inside = [q for s, q in zip(sure, quality, strict=True) if low <= s < high]
                mean = f"{sum(inside) / len(inside):.1f}" if inside else "-"
                rows.append(f"| {low:.1f} - {min(high, 1.0):.1f} | {len(inside)} | {mean} |")
            tables.append("\n".join(rows))
    emit("\n".join(lines) + "\n\n" + "\n\n".join(tables), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
