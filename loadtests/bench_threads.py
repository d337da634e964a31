"""One OpenMP team or two: what running the model on a second thread costs a CPU server.

    python loadtests/bench_threads.py --rounds 3

A Serve replica decodes on its engine's thread (service/engine/engine.py). If another thread of the process
has also run parallel torch ops (a warm-up on the constructor's thread, say), libgomp holds two
thread teams, counts more threads than CPUs, and stops spin-waiting between parallel regions: each
of the ~1,000 regions of a decoder step then waits for a futex wake-up. Each setup runs in a fresh
process (teams live as long as their thread), the setups take turns round by round:

- engine: as a replica now starts: Translator.load, Engine, Engine.warm_up on the engine's thread;
- engine+main-team: the same, plus the model run once on the main thread first;
- direct: Translator.translate_ids on the main thread, no engine (the same decoding, one thread).

Each process decodes --requests one-sentence requests one after another (latency) and then all at
once (a burst; elapsed throughput), beam 4, with --threads intra-op threads.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("BEAMSERVE_DATA", REPO.parent / "shared" / "data" / "multi30k"))
SETUPS = ("engine", "engine+main-team", "direct")


def native_threads() -> int:
    """Threads of this process that Python did not start (OpenMP's workers among them)."""
    py = {t.native_id for t in threading.enumerate()}
    return sum(int(t) not in py for t in os.listdir("/proc/self/task"))


def measure(setup: str, requests: int, threads: int, seed: int) -> dict[str, float]:
    """Runs in a fresh process: one setup's sequential latency and burst throughput."""
    sys.path.insert(0, str(REPO))
    from model import DecodeOptions, Translator
    from service.batching import BatchingConfig
    from service.engine.engine import Engine
    from service.engine.served_model import WARMUP

    tr = Translator.load("en-de", "cpu", num_threads=threads)
    with gzip.open(DATA / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        texts = [line.strip() for line in f if line.strip()]
    sources = [tr.encode(t) for t in random.Random(seed).sample(texts, requests)]
    opts = DecodeOptions(beam_size=4)
    if setup == "direct":
        for beam in (1, 4):
            tr.translate([WARMUP], beam_size=beam)

        def one(ids: list[int]) -> None:
            tr.translate_ids([ids], opts)

        def burst() -> None:
            tr.translate_ids(sources, DecodeOptions(beam_size=4, max_batch_size=64))
    else:
        if setup == "engine+main-team":
            for beam in (1, 4):
                tr.translate([WARMUP], beam_size=beam)
        engine = Engine(tr, BatchingConfig(), max_length=256)
        engine.warm_up([tr.encode(WARMUP)])

        def one(ids: list[int]) -> None:
            asyncio.run(engine.translate([ids], opts, 600.0))

        async def all_at_once() -> None:
            await asyncio.gather(*(engine.translate([ids], opts, 600.0) for ids in sources))

        def burst() -> None:
            asyncio.run(all_at_once())

    latencies = []
    cpu = time.process_time()
    for ids in sources:
        start = time.perf_counter()
        one(ids)
        latencies.append(time.perf_counter() - start)
    start = time.perf_counter()
    burst()
    burst_s = time.perf_counter() - start
    return {
        "latency_ms": 1000 * statistics.median(latencies),
        "burst_sent_s": requests / burst_s,
        "cpu_s": time.process_time() - cpu,
        "native_threads": native_threads(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--worker", choices=SETUPS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(measure(args.worker, args.requests, args.threads, args.seed)))
        return
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in SETUPS}
    for r in range(args.rounds):
        for setup in SETUPS if r % 2 == 0 else SETUPS[::-1]:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    setup,
                    "--requests",
                    str(args.requests),
                    "--threads",
                    str(args.threads),
                    "--seed",
                    str(args.seed),
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            runs[setup].append(json.loads(out.strip().splitlines()[-1]))
            m = runs[setup][-1]
            print(
                f"round {r + 1}/{args.rounds} {setup}: request {m['latency_ms']:.0f} ms, burst "
                f"{m['burst_sent_s']:.1f} sent/s",
                file=sys.stderr,
                flush=True,
            )
    print(
        f"\n{args.requests} one-sentence requests (beam 4), {args.threads} threads, median of {args.rounds} "
        "rounds, each setup in a fresh process:\n"
    )
    print("| setup | request latency ms (one at a time) | burst sentences/s | CPU s | native threads |")
    print("|---|---:|---:|---:|---:|")
    for setup, ms in runs.items():

        def med(key: str, ms: list[dict[str, float]] = ms) -> float:
            return statistics.median(m[key] for m in ms)

        print(
            f"| {setup} | {med('latency_ms'):.0f} | {med('burst_sent_s'):.1f} | {med('cpu_s'):.1f} | "
            f"{med('native_threads'):.0f} |"
        )


if __name__ == "__main__":
    main()
