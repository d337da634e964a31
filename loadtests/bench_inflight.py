"""Continuous batching's own cost, variants side by side in one process: model/inflight.py's switches.

    python loadtests/bench_inflight.py --rounds 5

Test_2016_flickr sentences in random order go through one `InflightBatch` (beam 4, 256 rows) two ways:
as the engine feeds it under a backlog (whenever --join-at sentences' rows are free, the next ones
join), and one request at a time (--singles sentences, each decoded to its end before the next). Each
variant decodes the same sentences in turn, round by round, on one thread, timed by the process's CPU
time (which a busy neighbour does not inflate); every variant must give the same tokens. Variants:

- current: the code as it is;
- wide-tokens: beam-search token buffers max_length (256) wide from the start, as before session 8;
- first-step-K-rows: a newcomer's first step on its K identical rows in the shared step, as a GPU does;
- regroup-every-step: the full regrouping (compaction, row indices) even when no sentence left;
- session-7: all three of the above.
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
VARIANTS = {  # name -> (TOKEN_WIDTH, FIRST_STEP_APART, the short path when no sentence left)
    "current": (inflight.TOKEN_WIDTH, True, True),
    "wide-tokens": (256, True, True),
    "first-step-K-rows": (inflight.TOKEN_WIDTH, False, True),
    "regroup-every-step": (inflight.TOKEN_WIDTH, True, False),
    "session-7": (256, False, False),
}
ADVANCE = InflightBatch._advance


def _regroup_always(batch: InflightBatch, updates: dict) -> None:  # type: ignore[type-arg]
    batch._regroup(updates, advance=True)


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


def decode_singles(tr: Translator, sources: list[list[int]], opts: DecodeOptions) -> dict[Hashable, list[int]]:
    """Each source alone through the same InflightBatch, one after another; key -> best tokens."""
    batch = InflightBatch(tr.model, rows=256, max_length=256)
    search = tr.search_options(opts)
    out: dict[Hashable, list[int]] = {}
    for key, ids in enumerate(sources):
        batch.add([key], [ids], tr.max_lengths([ids], opts).tolist(), search)
        while batch.rows or key not in out:
            for k, hyps in batch.step():
                out[k] = hyps[0].tokens
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sentences", type=int, default=512)
    ap.add_argument("--join-at", type=int, default=16, help="free sentence slots that let newcomers join")
    ap.add_argument("--singles", type=int, default=64, help="sentences decoded one at a time")
    args = ap.parse_args()
    tr = Translator.load("en-de", "cpu", num_threads=1)
    with gzip.open(DATA / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        texts = [line.strip() for line in f if line.strip()][: args.sentences]
    random.Random(0).shuffle(texts)
    sources = [tr.encode(t) for t in texts]
    opts = DecodeOptions(beam_size=4)
    backlog: dict[str, list[float]] = {name: [] for name in VARIANTS}
    single: dict[str, list[float]] = {name: [] for name in VARIANTS}
    reference = None
    with torch.inference_mode():  # warm-up: first calls allocate and pick kernels
        decode_backlog(tr, sources[:64], opts, args.join_at)
        decode_singles(tr, sources[:4], opts)
    for r in range(args.rounds):
        for name, (width, apart, short_path) in VARIANTS.items():
            inflight.TOKEN_WIDTH, inflight.FIRST_STEP_APART = width, apart
            InflightBatch._advance = ADVANCE if short_path else _regroup_always  # type: ignore[method-assign]
            with torch.inference_mode():
                start = time.process_time()
                tokens = decode_backlog(tr, sources, opts, args.join_at)
                backlog[name].append(time.process_time() - start)
                start = time.process_time()
                alone = decode_singles(tr, sources[: args.singles], opts)
                single[name].append((time.process_time() - start) / args.singles * 1000)
            reference = reference or (tokens, alone)
            if (tokens, alone) != reference:
                raise SystemExit(f"{name} translated differently from {next(iter(VARIANTS))}")
            print(f"round {r + 1}/{args.rounds} {name}: backlog {backlog[name][-1]:.2f} s, one at a time "
                  f"{single[name][-1]:.1f} ms a sentence", file=sys.stderr, flush=True)
    base_b, base_s = statistics.median(backlog["current"]), statistics.median(single["current"])
    print(f"\nBeam 4, 1 thread, median CPU time of {args.rounds} rounds: a backlog of {len(sources)} sentences "
          f"joining {args.join_at} at a time, and {args.singles} sentences one at a time:\n")
    print("| variant | backlog CPU s | vs current | one at a time, ms a sentence | vs current |")
    print("|---|---:|---:|---:|---:|")
    for name in VARIANTS:
        b, one = statistics.median(backlog[name]), statistics.median(single[name])
        print(f"| {name} | {b:.2f} | {b / base_b:.2f}x | {one:.1f} | {one / base_s:.2f}x |")

if __name__ == "__main__":
    main()
