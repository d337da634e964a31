"""Continuous batching's own cost, variants side by side in one process: model/inflight.py's switches.

    python loadtests/bench_inflight.py --rounds 5

Test_2016_flickr sentences in random order go through one `InflightBatch` (beam 4, 256 rows) the way
the engine feeds it under a backlog: whenever --join-at sentences' rows are free, the next ones join.
Each variant decodes the same sentences in turn, round by round, on one thread, timed by the process's
CPU time (which a busy neighbour does not inflate); every variant must give the same tokens. Variants:

- current: the code as it is (token buffers grown as needed, CPU first step one row per sentence);
- wide-tokens: beam-search token buffers max_length (256) wide from the start, as before session 8;
- first-step-K-rows: a newcomer's first step on its K identical rows in the shared step, as a GPU does;
- session-7: both of the above.
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
import statistics
import sys
import time
from collections.abc import Hashable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from model import DecodeOptions, Translator, inflight  # noqa: E402
from model.inflight import InflightBatch  # noqa: E402

DATA = Path(os.environ.get("BEAMSERVE_DATA", REPO.parent / "shared" / "data" / "multi30k"))
VARIANTS = {  # name -> (TOKEN_WIDTH, FIRST_STEP_APART)
    "current": (inflight.TOKEN_WIDTH, True),
    "wide-tokens": (256, True),
    "first-step-K-rows": (inflight.TOKEN_WIDTH, False),
    "session-7": (256, False),
}


def decode_backlog(
    tr: Translator, sources: list[list[int]], opts: DecodeOptions, join_at: int,
) -> dict[Hashable, list[int]]:
    """All sources through one InflightBatch, newcomers joining join_at at a time; key -> best tokens."""
    K = opts.beam_size
    batch = InflightBatch(tr.model, rows=64 * K, max_length=256)
    search = tr.search_options(opts)
    out: dict[Hashable, list[int]] = {}
    nxt = 0
    while nxt < len(sources) or batch.rows:
        free = (batch.capacity - batch.rows) // K
        if nxt < len(sources) and free >= min(join_at, len(sources) - nxt):
            take = list(range(nxt, min(len(sources), nxt + free)))
            nxt += len(take)
            ids = [sources[i] for i in take]
            batch.add(list(take), ids, tr.max_lengths(ids, opts).tolist(), search)
        for key, hyps in batch.step():
            out[key] = hyps[0].tokens
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sentences", type=int, default=512)
    ap.add_argument("--join-at", type=int, default=16, help="free sentence slots that let newcomers join")
    args = ap.parse_args()
    tr = Translator.load("en-de", "cpu", num_threads=1)
    with gzip.open(DATA / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        texts = [line.strip() for line in f if line.strip()][: args.sentences]
    random.Random(0).shuffle(texts)
    sources = [tr.encode(t) for t in texts]
    opts = DecodeOptions(beam_size=4)
    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    reference = None
    for r in range(args.rounds):
        for name, (width, apart) in VARIANTS.items():
            inflight.TOKEN_WIDTH, inflight.FIRST_STEP_APART = width, apart
            start = time.process_time()
            with torch.inference_mode():
                tokens = decode_backlog(tr, sources, opts, args.join_at)
            seconds[name].append(time.process_time() - start)
            reference = reference or tokens
            if tokens != reference:
                raise SystemExit(f"{name} translated differently from {next(iter(VARIANTS))}")
            print(f"round {r + 1}/{args.rounds} {name}: {seconds[name][-1]:.2f} s", file=sys.stderr, flush=True)
    base = statistics.median(seconds["current"])
    print(f"\n{len(sources)} sentences, beam 4, newcomers join {args.join_at} at a time, 1 thread, "
          f"median CPU seconds of {args.rounds} rounds:\n")
    print("| variant | CPU s | vs current |\n|---|---:|---:|")
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.2f} | {median / base:.2f}x |")


if __name__ == "__main__":
    main()
