"""Translation memories at 100,000 units: a TMX file of Multi30k's training pairs (each sentence again with a
number where the data has fewer) imported through `POST /v1/memories` on a served en-de, and the time a
lookup adds to a sentence: exact, and fuzzy at min_match 0.9 and 0.8 for sentences of the memory with one
word changed, each with the check of what its match carries over (service/text/memory.py, what a gateway
runs for each sentence of a request); then sent one at a time with the memory at min_match 0.8 and without it,
taking turns: test sentences the memory does not hold (each decoded either way: what looking a request up
costs it), and memory sentences with one word changed (with the memory: decoded, and the match scored by the
model to decide it, service/routing/recall.py).

    python loadtests/bench_memory_lookup.py --out loadtests/results/memory_lookup.md
"""

from __future__ import annotations

import argparse
import gzip
import random
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import harness
from reports import emit

from service.text import tmx
from service.text.memory import MemoryIndex, carried


def lines(name: str) -> list[str]:
    with gzip.open(harness.DATA / name, "rt", encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def units_of(count: int) -> dict[str, str]:
    english, german = lines("train.en.gz"), lines("train.de.gz")
    out: dict[str, str] = {}
    i = 0
    while len(out) < count:
        e, d = english[i % len(english)], german[i % len(german)]
        rounds = i // len(english)
        out[f"{e} ({rounds})" if rounds else e] = d
        i += 1
    return out


def edited(sentence: str, rng: random.Random) -> str:
    words = sentence.split()
    words[rng.randrange(len(words))] = "zebra"
    return " ".join(words)


def quantiles(times: list[float]) -> str:
    times = sorted(times)
    return f"{1e3 * times[len(times) // 2]:.2f} | {1e3 * harness.quantile(times, 0.95):.2f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--units", type=int, default=100_000)
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--served", type=int, default=100, help="sentences sent one at a time, with and without")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    rng = random.Random(1)
    units = units_of(args.units)
    data = tmx.write(units, "en", "de")
    t = time.perf_counter()
    read = tmx.read(data, "en", "de")
    read_s = time.perf_counter() - t
    t = time.perf_counter()
    index = MemoryIndex(read)
    index_s = time.perf_counter() - t
    sources = list(units)
    exact = [rng.choice(sources) for _ in range(args.queries)]
    fuzzy = [edited(s, rng) for s in exact]
    rows = [f"| exact | {quantiles([timed(index, s, 1.0) for s in exact])} | |"]
    for least in (0.9, 0.8):
        times = [timed(index, s, least) for s in fuzzy]
        found = sum(index.lookup(s, least) is not None for s in fuzzy)
        rows.append(f"| fuzzy, min_match {least} | {quantiles(times)} | {found} of {len(fuzzy)} |")
    print(
        f"{len(data) / 1e6:.1f} MB of TMX, {len(read):,} units: read {read_s:.1f} s, indexed {index_s:.1f} s",
        flush=True,
    )

    server = harness.Server()
    try:
        with httpx.Client(base_url=server.url, timeout=300) as client:
            t = time.perf_counter()
            r = client.post(
                "/v1/memories",
                files={"file": ("memory.tmx", data)},
                data={"name": "bench", "source_lang": "en", "target_lang": "de"},
            )
            imported_s = time.perf_counter() - t
            r.raise_for_status()
            memory = r.json()["memory_id"]
            asked = {"id": memory, "min_match": 0.8}
            one(client, fuzzy[0], asked)  # the gateway builds the memory's index on its first use
            plain, recalled = [], []
            for s in harness.test_sentences(args.served):  # taking turns, each with the memory and without
                plain.append(one(client, s, None))
                recalled.append(one(client, s, asked))
            near_plain: list[float] = []
            near_checked: list[float] = []
            for s in fuzzy[: args.served]:
                near_plain.append(one(client, s, None))
                near_checked.append(one(client, s, asked))
    finally:
        server.stop()
    checked = statistics.median(near_checked) - statistics.median(near_plain)
    report = "\n".join(
        [
            "# Translation memory at 100,000 units",
            "",
            f"A TMX file of {len(data) / 1e6:.1f} MB, {len(read):,} en-de units: read {read_s:.1f} s and indexed"
            f" {index_s:.1f} s in this process; imported through `POST /v1/memories` on a served en-de in"
            f" {imported_s:.1f} s (upload, read, stored).",
            "",
            f"A lookup in this process ({args.queries} sentences of the memory; fuzzy: one word of each changed), ms:",
            "",
            "| lookup | p50 | p95 | found |",
            "|---|---:|---:|---:|",
            *rows,
            "",
            f"Served, one request at a time ({args.served} test sentences, none in the memory, so each is decoded"
            " either way; each with the memory at min_match 0.8 and without, taking turns; cache off), ms:",
            "",
            "| request | p50 | p95 |",
            "|---|---:|---:|",
            f"| without the memory | {quantiles(plain)} |",
            f"| with the memory | {quantiles(recalled)} |",
            f"| difference of medians | {1e3 * (statistics.median(recalled) - statistics.median(plain)):+.2f} | |",
            "",
            f"Served as above, {len(near_plain)} sentences of the memory with one word changed (with the memory, a"
            " fuzzy match at 0.8 that differs in a word: the sentence decoded and the match scored, then decided), ms:",
            "",
            "| request | p50 | p95 |",
            "|---|---:|---:|",
            f"| without the memory | {quantiles(near_plain)} |",
            f"| with the memory, the match checked | {quantiles(near_checked)} |",
            f"| difference of medians | {1e3 * checked:+.2f} | |",
        ]
    )
    emit(report + "\n", args.out)
    return 0


def timed(index: MemoryIndex, sentence: str, least: float) -> float:
    """One lookup and, for a fuzzy match, the check of what it carries over."""
    t = time.perf_counter()
    found = index.lookup(sentence, least)
    if found is not None and found.score < 1.0:
        carried(found.source, found.target, sentence)
    return time.perf_counter() - t


def one(client: httpx.Client, text: str, memory: dict[str, object] | None) -> float:
    body: dict[str, object] = {"texts": [text], "source": "en", "target": "de", "cache": False}
    if memory is not None:
        body["memory"] = memory
    t = time.perf_counter()
    r = client.post("/v1/translate", json=body)
    took = time.perf_counter() - t
    r.raise_for_status()
    return took


if __name__ == "__main__":
    raise SystemExit(main())
