"""Resident memory and speed of a model replica's engine under a long mixed load, per allocator.

    python loadtests/bench_memory.py --out runs/bench/memory.md
    python loadtests/bench_memory.py --rounds 200 --allocators system,jemalloc

Each allocator runs the same load in its own process (jemalloc preloaded with LD_PRELOAD, as
`BEAMSERVE_ALLOCATOR=auto` does for the replicas): the shipped en-de model behind the serving
engine (service/engine/engine.py, continuous batching), rounds of 8 concurrent requests of 1-12
test_2016_flickr sentences with beam sizes 1-5, n-best lists, n-gram bans, and some requests
cancelled or timed out mid-decode, all from one seed. It prints the resident set size every 50
rounds, and the sentences decoded per CPU-second of the process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from reports import emit  # noqa: E402

EVERY = 50  # rounds between memory samples


def load(rounds: int, seed: int) -> dict[str, object]:
    """One process's run: RSS samples (MiB) and sentences per CPU-second."""
    import gzip

    import psutil

    from model.options import DecodeOptions
    from model.translator import Translator
    from service.batching import BatchingConfig
    from service.engine.allocator import in_use
    from service.engine.engine import Engine

    tr = Translator.load("en-de", "cpu", num_threads=1)
    # Every request admitted (no time-based refusal), so both allocators see the same work.
    engine = Engine(tr, BatchingConfig(max_queue_wait_s=1e9), max_length=256)
    with gzip.open(REPO / "tests/data/multi30k/test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        sources = [tr.encode(line.strip()) for line in f if line.strip()]
    proc, rng, done = psutil.Process(), random.Random(seed), [0]

    async def one() -> None:
        n, beam = rng.randint(1, 12), rng.randint(1, 5)
        opts = DecodeOptions(
            beam_size=beam, num_hypotheses=rng.randint(1, beam), no_repeat_ngram_size=rng.choice([0, 0, 3])
        )
        wait = 0.05 if rng.random() < 0.05 else 60.0  # some clients hang up mid-decode
        try:
            await asyncio.wait_for(engine.translate(rng.sample(sources, n), opts, timeout_s=60), wait)
            done[0] += n
        except TimeoutError:
            pass

    async def run() -> list[float]:
        samples = []
        for r in range(rounds + 1):
            if r % EVERY == 0:
                samples.append(proc.memory_info().rss / 2**20)
                print(f"  {in_use()}: round {r}, rss {samples[-1]:.0f} MiB", file=sys.stderr, flush=True)
            if r < rounds:
                await asyncio.gather(*(one() for _ in range(8)))
        return samples

    cpu = time.process_time()
    samples = asyncio.run(run())
    cpu = time.process_time() - cpu
    engine.close()
    return {"allocator": in_use(), "rss": samples, "sentences_per_cpu_s": done[0] / cpu}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--allocators", default="system,jemalloc")
    p.add_argument("--rounds", type=int, default=700)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(load(args.rounds, args.seed)))
        return 0
    from service.engine.allocator import replica_env

    results = []
    for name in args.allocators.split(","):
        env = {**os.environ, **replica_env(name)}  # type: ignore[arg-type]
        if name == "system":
            env.pop("LD_PRELOAD", None)
        cmd = [sys.executable, __file__, "--child", "--rounds", str(args.rounds), "--seed", str(args.seed)]
        out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    header = ["allocator", *(f"round {r}" for r in range(0, args.rounds + 1, EVERY)), "sentences / CPU-s"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for res in results:
        rss = " | ".join(f"{v:.0f}" for v in res["rss"])  # type: ignore[attr-defined]
        lines.append(f"| {res['allocator']} | {rss} | {res['sentences_per_cpu_s']:.1f} |")
    table = (
        f"Resident MiB of the engine process every {EVERY} rounds (`python loadtests/bench_memory.py "
        f"--rounds {args.rounds} --allocators {args.allocators}`):\n\n" + "\n".join(lines) + "\n"
    )
    emit(table, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
