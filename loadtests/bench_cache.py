"""The gateway's translation cache under a workload where half the sentences repeat.

    python loadtests/bench_cache.py --out runs/bench/cache.md
    python loadtests/bench_cache.py --phase-s 10 --clients 8

One `beamserve serve` (en-de) on 127.0.0.1 and a closed loop of --clients clients, each sending
one-sentence requests: half drawn from 50 popular sentences (a site's navigation and boilerplate),
half never seen before in the run (Multi30k sentences, each used once). Phases alternate between
`"cache": false` and `"cache": true` on the same server (off, on, off, on, ...), so both modes meet
the same process, warm-up and machine; each phase reports requests/s and latency percentiles, and
the summary the ratio of the modes' throughputs.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import random
import sys
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import Server, quantile  # noqa: E402
from reports import emit  # noqa: E402

DATA = HERE.parent / "tests" / "data" / "multi30k"


def sentences() -> list[str]:
    out: list[str] = []
    for name in ("train.en.gz", "val.en.gz", "test_2016_flickr.en.gz"):
        with gzip.open(DATA / name, "rt", encoding="utf-8") as f:
            out += [line.strip() for line in f if line.strip()]
    return list(dict.fromkeys(out))


async def phase(url: str, cache: bool, seconds: float, clients: int, popular: list[str], fresh: list[str]) -> dict:
    latencies: list[float] = []
    errors = 0
    rng = random.Random(len(fresh))
    stop = time.monotonic() + seconds

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal errors
        while time.monotonic() < stop and fresh:
            text = rng.choice(popular) if rng.random() < 0.5 else fresh.pop()
            t0 = time.monotonic()
            r = await http.post("/v1/translate", json={"texts": [text], "source": "en", "target": "de", "cache": cache})
            if r.status_code == 200:
                latencies.append(time.monotonic() - t0)
            else:  # 503 when the model is saturated: back off as a client told Retry-After would
                errors += 1
                await asyncio.sleep(0.5)

    start = time.monotonic()
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    elapsed = time.monotonic() - start
    p50, p95 = (quantile(latencies, q) * 1000 for q in (0.5, 0.95))
    return {"cache": cache, "rps": len(latencies) / elapsed, "p50": p50, "p95": p95, "errors": errors}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phase-s", type=float, default=15.0)
    p.add_argument("--phases", type=int, default=4, help="alternating off/on phases (even)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    pool = sentences()
    rng = random.Random(0)
    rng.shuffle(pool)
    popular, fresh = pool[:50], pool[50:]
    server = Server()
    rows = []
    try:
        for i in range(args.phases):
            cache = i % 2 == 1
            row = asyncio.run(phase(server.url, cache, args.phase_s, args.clients, popular, fresh))
            rows.append(row)
            print(
                f"phase {i + 1}: cache {'on ' if cache else 'off'} {row['rps']:.1f} requests/s, "
                f"p50 {row['p50']:.0f} ms, p95 {row['p95']:.0f} ms, {row['errors']} errors",
                file=sys.stderr,
                flush=True,
            )
        stats = httpx.get(f"{server.url}/v1/stats", timeout=10).json()["en-de"]["gateway"]
    finally:
        server.stop()
    on = [r for r in rows if r["cache"]]
    off = [r for r in rows if not r["cache"]]

    def mean(rs: list[dict], k: str) -> float:
        return sum(r[k] for r in rs) / len(rs)

    lines = [
        f"Half the sentences repeat (50 popular ones), {args.clients} closed-loop clients, one sentence a "
        f"request, en-de; phases of {args.phase_s:.0f} s alternating on one server "
        f"(`python loadtests/bench_cache.py --phase-s {args.phase_s:.0f} --clients {args.clients}`):",
        "",
        "| phase | cache | requests/s | p50 ms | p95 ms | not 200 |",
        "|---:|---|---:|---:|---:|---:|",
        *(
            f"| {i + 1} | {'on' if r['cache'] else 'off'} | {r['rps']:.1f} | {r['p50']:.0f} | {r['p95']:.0f} | "
            f"{r['errors']} |"
            for i, r in enumerate(rows)
        ),
        "",
        f"Cache on / off: {mean(on, 'rps') / mean(off, 'rps'):.2f}x the requests/s, p95 "
        f"{mean(on, 'p95'):.0f} ms against {mean(off, 'p95'):.0f} ms. The gateway's cache at the end: "
        f"{stats['cache']['entries']} entries, {stats['cache_hits']} hits, {stats['cache_misses']} misses.",
    ]
    report = "\n".join(lines) + "\n"
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
