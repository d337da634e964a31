"""How many model replicas one device should hold: the served burst capacity of 1, 2, 4, ...
replica processes sharing one GPU (Ray Serve's fractional num_gpus: BEAMSERVE_REPLICA_GPUS=0.25 puts
four on a GPU), each with its own engine and host thread, against one replica alone.

    python loadtests/bench_packing.py --device cuda --replicas 1,2,4,8      # gpu_run.sh's "packing" stage
    python loadtests/bench_packing.py --device cpu --replicas 1x2,2x1 --requests 512   # on 2 cores

A layout is REPLICAS or REPLICASxTHREADS (torch threads per replica, 1 by default): on a CPU,
1x2,2x1 compares one two-thread replica with two one-thread replicas on the same cores.

Each replica is a process as under Serve: it loads the model, builds the continuous-batching engine
at the device's sizes (service/batching.py sized_for), warms up, then waits at a barrier; all are
released together and each decodes its share of one burst of one-sentence requests
(test_2016_flickr, beam 4). Capacity is the burst's sentences over the time from the release to the
last replica's last answer. The alternative layout, every pair in one replica per GPU, has one host
thread issuing every pair's decoder steps: the 1-replica row is its ceiling.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import multiprocessing as mp
import os
import queue
import random
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from reports import emit  # noqa: E402

DATA = Path(os.environ.get("BEAMSERVE_DATA", REPO.parent / "shared" / "data" / "multi30k"))


def replica(device: str, model: str, texts: list[str], beam: int, threads: int, barrier: Any, out: Any) -> None:
    """One replica process: load, warm up, wait for the others, decode its share; report its end time."""
    from model import DecodeOptions, Translator
    from service.batching import sized_for
    from service.engine.engine import Engine
    from service.settings import Settings

    tr = Translator.load(model, device, num_threads=threads)
    # The whole share is accepted at once: the work is what is measured, not admission.
    config = sized_for(tr.device.type, {"mode": "continuous"})
    config = replace(config, max_queue_wait_s=600.0, max_queue=max(config.max_queue, len(texts)))
    # The decode path a replica takes by default (on a GPU the static state, its graphs captured in the warm-up).
    engine = Engine(tr, config, max_length=256, static_slots=Settings().uses_static_slots(tr.device.type))
    engine.warm_up([tr.encode(t) for t in texts[:64]])
    sources = [tr.encode(t) for t in texts]
    opts = DecodeOptions(beam_size=beam)

    async def burst() -> None:
        await asyncio.gather(*(engine.translate([ids], opts, 600.0) for ids in sources))

    barrier.wait()
    asyncio.run(burst())
    out.put(time.time())
    engine.close()


def measure(n: int, threads: int, device: str, model: str, texts: list[str], beam: int) -> float:
    """Sentences a second of n replica processes sharing the device, on one burst split among them."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(n + 1), ctx.Queue()
    shares = [texts[i::n] for i in range(n)]
    procs = [ctx.Process(target=replica, args=(device, model, s, beam, threads, barrier, out)) for s in shares]
    for p in procs:
        p.start()
    barrier.wait(timeout=600)
    start = time.time()
    ends: list[float] = []
    while len(ends) < n:
        try:
            ends.append(out.get(timeout=1.0))
        except queue.Empty:
            failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if failed:
                raise SystemExit(f"a replica process failed (exit codes {failed})") from None
    for p in procs:
        p.join(60)
    return len(texts) / (max(ends) - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="en-de")
    ap.add_argument("--replicas", default="1,2,4", help="layouts, each a run: REPLICAS or REPLICASxTHREADS")
    ap.add_argument("--requests", type=int, default=2048, help="one-sentence requests in the burst")
    ap.add_argument("--beam-size", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with gzip.open(DATA / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        pool = [line.strip() for line in f if line.strip()]
    rng = random.Random(args.seed)
    texts = [rng.choice(pool) for _ in range(args.requests)]
    layouts = [(int(n), int(t or 1)) for n, _, t in (item.partition("x") for item in args.replicas.split(","))]
    rates: list[float] = []  # per layout, in order (a layout may come twice, alternating with another)
    for n, threads in layouts:
        rates.append(measure(n, threads, args.device, args.model, texts, args.beam_size))
        print(f"{n} replica(s) x {threads} thread(s): {rates[-1]:.1f} sentences/s", file=sys.stderr, flush=True)
    base = rates[0]
    lines = [
        f"{args.requests} one-sentence requests, beam {args.beam_size}, {args.model}, device {args.device}, "
        "each replica a process with its own engine:\n",
        "| replicas on the device | torch threads each | sentences/s | vs the first |",
        "|---:|---:|---:|---:|",
        *(f"| {n} | {t} | {rate:.1f} | {rate / base:.2f}x |" for (n, t), rate in zip(layouts, rates, strict=True)),
    ]
    emit("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
