"""Work per sentence of each batching mode: a burst of requests at once, timed in CPU seconds.

    python loadtests/bench_burst.py --threads 1 --requests 256 --rounds 3
    python loadtests/bench_burst.py --configs continuous --compute-types float32,int8   # one replica's engine

The batching benchmark (bench_batching.py) measures latency under load; this measures the cost of
the work itself. Every configuration gets the same burst of one-sentence requests (test_2016_flickr,
drawn at random, beam 4), all submitted at once to its engine (service/engine/engine.py, in-process), and
the configurations take turns round by round. With --threads 1 the process's CPU time does not
count what other tenants of a shared machine take, so small differences show through its noise.
"offline" is Translator.translate_ids on the same sentences in batches of 64 in arrival order, the
work with no scheduler at all. With more than one thread, each engine's thread and the main thread
(offline) would each start an OpenMP team and slow one another down (Translator.load,
bench_threads.py): compare elapsed times only with --threads 1.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_batching import batching_config  # noqa: E402

from model import DecodeOptions, Translator  # noqa: E402
from service.engine.engine import Engine  # noqa: E402

DATA = Path(os.environ.get("BEAMSERVE_DATA", REPO.parent / "shared" / "data" / "multi30k"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--configs",
        default="request,continuous,offline",
        help="batching configurations as in bench_batching.py, and offline",
    )
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--beam-size", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", default="en-de")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--compute-types", default="float32", help="each configuration with each (model/kernels/compute_type.py)"
    )
    args = ap.parse_args()
    types = args.compute_types.split(",")
    translators = {t: Translator.load(args.model, "cpu", compute_type=t, num_threads=args.threads) for t in types}
    tr = translators[types[0]]
    with gzip.open(DATA / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        texts = [line.strip() for line in f if line.strip()]
    sources = [tr.encode(t) for t in random.Random(args.seed).sample(texts, args.requests)]
    opts = DecodeOptions(beam_size=args.beam_size)
    # "config" alone with one compute type, "config compute_type" with several.
    names = [f"{n} {t}" if len(types) > 1 else n for n in args.configs.split(",") for t in types]
    kind = {name: (name.split(" ")[0], translators[name.split(" ")[1]] if " " in name else tr) for name in names}
    # The whole burst is accepted (the work is what is timed): no refusal for time queued.
    engines = {
        n: Engine(kind[n][1], replace(batching_config(kind[n][0]), max_queue_wait_s=600.0), max_length=256)
        for n in names
        if kind[n][0] != "offline"
    }

    async def burst(engine: Engine) -> None:
        await asyncio.gather(*(engine.translate([ids], opts, 600.0) for ids in sources))

    def run(name: str) -> tuple[float, float]:
        cpu, wall = time.process_time(), time.perf_counter()
        if kind[name][0] == "offline":
            for i in range(0, len(sources), 64):
                kind[name][1].translate_ids(
                    sources[i : i + 64], DecodeOptions(beam_size=args.beam_size, max_batch_size=64)
                )
        else:
            asyncio.run(burst(engines[name]))
        return time.process_time() - cpu, time.perf_counter() - wall

    for name in names:  # warm-up
        run(name)
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            c, w = run(name)
            cpu[name].append(c)
            print(
                f"round {r + 1}/{args.rounds} {name}: {args.requests / c:.1f} sentences per CPU second "
                f"({args.requests / w:.1f} per second elapsed)",
                file=sys.stderr,
                flush=True,
            )
    for engine in engines.values():
        engine.close()
    base = statistics.median(cpu[names[0]])
    print(
        f"\n{args.requests} requests of one sentence, beam {args.beam_size}, {args.threads} thread(s), "
        f"median of {args.rounds} rounds:\n"
    )
    print("| configuration | sentences per CPU second | CPU time vs " + names[0] + " |\n|---|---:|---:|")
    for name in names:
        med = statistics.median(cpu[name])
        print(f"| {name} | {args.requests / med:.1f} | {med / base:.2f}x |")


if __name__ == "__main__":
    main()
