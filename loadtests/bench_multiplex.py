"""Twenty pairs on the same CPUs: the model pool (service/engine/pool.py) against one dedicated deployment
per pair, side by side on one mixed workload, and a cold pooled model's time to first translation.

    BEAMSERVE_DATA=../shared/data/multi30k python loadtests/bench_multiplex.py --requests 600

Each pair is a copy of the shipped en-de under its own name (a model of the real size, 7.6M
parameters). The workload draws pairs from a Zipf distribution (a few busy pairs, most of them
rare), one Multi30k sentence a request, beam 4, `--concurrency` requests in flight; the same
sequence for every layout. Layouts: `dedicated` (twenty deployments, each replica with
2/20 CPU), `pool` (two pool replicas of one CPU, `--per-replica` models each). Reported per layout:
requests/s, p50 and p95 latency, the replicas' resident memory, and for the pool the cold start:
the first translation of a model no replica holds, against one it holds.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from faults import Server  # noqa: E402
from reports import emit  # noqa: E402

DATA = Path(os.environ.get("BEAMSERVE_DATA", REPO.parent / "shared" / "data" / "multi30k"))
TARGETS = ["hr", "ga", "es", "it", "pt", "nl", "sv", "da", "fi", "pl", "cs", "ro", "hu", "el", "bg"]
TARGETS += ["sk", "sl", "lt", "lv", "et"]


def registry(root: Path, pool: bool) -> list[dict[str, Any]]:
    out = []
    for target in TARGETS:
        path = root / f"en-{target}"
        if not path.exists():
            shutil.copytree(REPO / "model" / "pretrained" / "en-de", path)
        out.append({"name": f"en-{target}", "path": str(path), "sources": ["en"], "targets": [target], "pool": pool})
    return out


def replicas_rss(server: Server) -> int:
    total = 0
    for p in psutil.Process(server.proc.pid).children(recursive=True):
        try:
            line = " ".join(p.cmdline())
            if "ServeReplica:beamserve:model-" in line:
                total += p.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


def timed(url: str, target: str, text: str) -> tuple[int, float]:
    start = time.perf_counter()
    body = {"texts": [text], "source": "en", "target": target, "beam_size": 4}
    status = httpx.post(f"{url}/v1/translate", json=body, timeout=120).status_code
    return status, time.perf_counter() - start


def run(url: str, work: list[tuple[str, str]], concurrency: int) -> dict[str, float]:
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda w: timed(url, *w), work))
    elapsed = time.perf_counter() - start
    latencies = sorted(lat for _, lat in results)
    return {
        "ok": sum(status == 200 for status, _ in results),
        "rps": len(work) / elapsed,
        "p50": statistics.median(latencies),
        "p95": latencies[int(0.95 * (len(latencies) - 1))],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--per-replica", default="4,10", help="models a pool replica holds; each value a layout")
    ap.add_argument("--zipf", type=float, default=1.2, help="skew of the pairs' popularity")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with gzip.open(DATA / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip()]
    rng = random.Random(args.seed)
    weights = [1 / (rank + 1) ** args.zipf for rank in range(len(TARGETS))]
    work = [(rng.choices(TARGETS, weights)[0], rng.choice(sentences)) for _ in range(args.requests)]
    root = Path(tempfile.mkdtemp(prefix="beamserve-twenty-"))
    rows = {}
    cold: dict[str, tuple[float, float]] = {}
    layouts = [("dedicated", 0)] + [(f"pool, {n} models a replica", int(n)) for n in args.per_replica.split(",")]
    try:
        for layout, per_replica in layouts:
            pool = per_replica > 0
            env = {
                "BEAMSERVE_MODEL_REGISTRY": json.dumps(registry(root, pool)),
                "BEAMSERVE_REPLICA_CPUS": "1" if pool else str(2 / len(TARGETS)),
                "BEAMSERVE_POOL_REPLICAS": "2",
                "BEAMSERVE_POOL_MODELS_PER_REPLICA": str(per_replica or 1),
                "BEAMSERVE_CACHE_ENTRIES": "0",
                "BEAMSERVE_REQUEST_TIMEOUT_S": "120",
                "BEAMSERVE_MAX_QUEUE_WAIT_S": "60",
            }
            print(f"{layout}: starting ...", file=sys.stderr, flush=True)
            started = time.perf_counter()
            server = Server(**env)
            up = time.perf_counter() - started
            try:
                if pool:  # a model no replica holds yet, then the same again (held)
                    first = timed(server.url, TARGETS[-1], sentences[0])[1]
                    cold[layout] = (first, timed(server.url, TARGETS[-1], sentences[1])[1])
                run(server.url, work[: args.concurrency], args.concurrency)  # warm-up
                rows[layout] = {**run(server.url, work, args.concurrency), "rss": replicas_rss(server), "up": up}
                print(f"{layout}: {rows[layout]}", file=sys.stderr, flush=True)
            finally:
                server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = rows["dedicated"]
    lines = [
        f"{len(TARGETS)} pairs (copies of the shipped en-de), {args.requests} requests of one sentence, Zipf "
        f"{args.zipf}, beam 4, {args.concurrency} in flight, 2 CPUs; the pool: 2 replicas of 1 CPU\n",
        "| layout | requests/s | vs dedicated | p50 s | p95 s | replicas' memory | start-up s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['rps']:.1f} | {r['rps'] / base['rps']:.2f}x | {r['p50']:.2f} | {r['p95']:.2f} | "
            f"{r['rss'] / 2**30:.2f} GiB | {r['up']:.0f} |"
        )
    for layout, (first, again) in cold.items():
        lines.append(f"\n{layout}: a model no replica holds, first translation {first:.2f} s, the next {again:.2f} s.")
    emit("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
