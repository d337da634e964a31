"""One sentence at a time, and at saturation: the server against the same model in one process.

    python loadtests/bench_latency.py                          # en-de, int8 and float32, one thread
    python loadtests/bench_latency.py --compute-types int8 --sentences 100 --saturation-s 20

For each compute type, on the same test sentences (test_2016_flickr, uncached, beam 4):
- in process: `Translator.translate` of each sentence alone, its wall time (p50, p95), and the
  offline rate at batch 64 (sentences/s); and the server's engine without the server (`Engine.translate`
  in one process): each sentence alone (p50), the rate with --concurrency sentences in flight, and that
  rate again with --loop-work-ms of Python run on the event loop after each answer, as a gateway
  parses, tokenizes and answers a request on the loop the engine's thread shares the GIL with;
- served: `beamserve serve --models en-de` (HAProxy in front, the model in the ingress) with the same
  compute type and intra-op threads, once per --engines placement (`process`: the engine in its own
  process, the default; `thread`: a thread of the ingress's process, BEAMSERVE_ENGINE_PROCESS=0),
  each sentence a request on one keep-alive connection, the next sent when the last is answered: the
  request's wall time at the client, and its Server-Timing (the engine's queue wait and decoding, the
  gateway's total), so the difference from in-process decoding is split between the engine's
  decoding, its queue and the path around it;
- saturated: --concurrency connections sending one sentence a request for --saturation-s seconds:
  sentences/s answered 200 against the offline rate, and how many requests were refused (the load
  generator shares the machine's cores: its CPU time is reported beside it).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import http_load  # noqa: E402
from harness import Server, quantile, test_sentences  # noqa: E402
from reports import emit  # noqa: E402


def in_process(
    compute_type: str,
    threads: int,
    alone: list[str],
    batched: list[str],
    rounds: int,
    concurrency: int,
    loop_work_s: float,
) -> dict[str, float]:
    """Each of `alone` through Translator.translate by itself (the best of `rounds` per sentence), and the rate
    over `batched` at batch 64; then the same through the server's engine (service/engine/engine.py) without the
    server: each of `alone` alone, and `batched` with `concurrency` sentences in flight, without and with
    `loop_work_s` of Python on the event loop after each answer. In a fresh process, as a replica's model is."""
    code = f"""
import asyncio, json, sys, time
from model import DecodeOptions, Translator
from service.engine.engine import Engine
from service.batching import BatchingConfig
tr = Translator.load("en-de", "cpu", compute_type={compute_type!r}, num_threads={threads})
texts, batched = json.loads(sys.stdin.read())
for t in texts[:8]:
    tr.translate([t], beam_size=4)
each = []
for t in texts:
    best = float("inf")
    for _ in range({rounds}):
        start = time.perf_counter()
        tr.translate([t], beam_size=4)
        best = min(best, time.perf_counter() - start)
    each.append(best)
tr.translate(batched[:64], beam_size=4, max_batch_size=64)
start = time.perf_counter()
for i in range(0, len(batched), 64):
    tr.translate(batched[i:i + 64], beam_size=4, max_batch_size=64)
rate = len(batched) / (time.perf_counter() - start)
engine, opts = Engine(tr, BatchingConfig(max_queue_wait_s=3600)), DecodeOptions(beam_size=4)
alone_ids, batched_ids = [tr.encode(t) for t in texts], [tr.encode(t) for t in batched]

async def engine_runs():
    for ids in alone_ids[:8]:
        await engine.translate([ids], opts, 60)
    engine_each = []
    for ids in alone_ids:
        best = float("inf")
        for _ in range({rounds}):
            start = time.perf_counter()
            await engine.translate([ids], opts, 60)
            best = min(best, time.perf_counter() - start)
        engine_each.append(best)

    async def saturated(work_s):
        left = iter(batched_ids)

        async def client():
            for ids in left:
                await engine.translate([ids], opts, 600)
                until = time.thread_time() + work_s  # Python holding the GIL, as a gateway's does
                while time.thread_time() < until:
                    pass

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range({concurrency})))
        return len(batched_ids) / (time.perf_counter() - start)

    return engine_each, await saturated(0.0), await saturated({loop_work_s})

engine_each, engine_rate, engine_loaded = asyncio.run(engine_runs())
engine.close()
print(json.dumps({{"each": each, "rate": rate, "engine_each": engine_each, "engine_rate": engine_rate,
                  "engine_loaded": engine_loaded}}))
"""
    import json

    out = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps([alone, batched]),
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    found = json.loads(out.stdout.strip().splitlines()[-1])
    each, engine_each = found["each"], found["engine_each"]
    return {
        "p50": quantile(each, 0.5),
        "p95": quantile(each, 0.95),
        "rate": found["rate"],
        "engine p50": quantile(engine_each, 0.5),
        "engine rate": found["engine_rate"],
        "engine loaded": found["engine_loaded"],
    }


def body(text: str) -> dict[str, object]:
    return {"texts": [text], "source": "en", "target": "de", "beam_size": 4, "cache": False}


def timings(header: str) -> dict[str, float]:
    """Server-Timing's durations, in seconds, by name."""
    out = {}
    for part in header.split(","):
        name, _, rest = part.strip().partition(";dur=")
        if rest:
            out[name] = float(rest) / 1000
    return out


async def one_at_a_time(port: int, sentences: list[str], rounds: int) -> dict[str, float]:
    """Each sentence a request on one keep-alive connection, the best of `rounds` per sentence; its Server-Timing.
    The client is http_load's (a prebuilt request, the answer's head parsed): its own time is a small part of
    the wall time, on cores it shares with the server."""
    walls: list[float] = []
    parts: dict[str, list[float]] = {"queue": [], "decode": [], "total": []}
    wire = [http_load.request_bytes("/v1/translate", body(t), port=port) for t in sentences]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def ask(request: bytes) -> tuple[float, dict[str, str]]:
        start = time.perf_counter()
        writer.write(request)
        status, _, answer, headers = await http_load.read_answer(reader, True)
        wall = time.perf_counter() - start
        if status != 200:
            raise SystemExit(f"{status}: {answer[:200]!r}")
        return wall, headers

    try:
        for request in wire[:8]:
            await ask(request)
        for request in wire:
            best, best_timing = float("inf"), {}
            for _ in range(rounds):
                wall, headers = await ask(request)
                if wall < best:
                    best, best_timing = wall, timings(headers.get("server-timing", ""))
            walls.append(best)
            for name in parts:
                parts[name].append(best_timing.get(name, float("nan")))
    finally:
        writer.close()
    out = {"p50": quantile(walls, 0.5), "p95": quantile(walls, 0.95)}
    out |= {f"{name} p50": statistics.median(v) for name, v in parts.items()}
    return out


async def saturated(port: int, sentences: list[str], concurrency: int, seconds: float) -> dict[str, float]:
    """`concurrency` connections, one sentence a request, for `seconds`: sentences/s and the client's CPU."""
    wire = [http_load.request_bytes("/v1/translate", body(t), port=port) for t in sentences]
    await http_load.closed_loop(port, wire, total=2 * concurrency, concurrency=concurrency)  # warm
    cpu = time.process_time()
    total = max(concurrency, int(seconds * 100))
    answers, wall = await http_load.closed_loop(port, wire, total=total, concurrency=concurrency)
    ok = sum(a.status == 200 for a in answers)
    return {
        "rate": ok / wall,
        "refused": len(answers) - ok,  # 503 overloaded from the admission, the rest of the closed loop's errors
        "sent": len(answers),
        "client_cpu": (time.process_time() - cpu) / wall,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compute-types", default="int8,float32")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads, in process and in the server")
    p.add_argument("--sentences", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3, help="timings of each sentence; its best is kept")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--saturation-s", type=float, default=20.0)
    p.add_argument(
        "--loop-work-ms",
        type=float,
        default=1.0,
        help="Python on the in-process engine's event loop after each answer (about a gateway's per request)",
    )
    p.add_argument("--engines", default="process,thread", help="where the server's engine runs: process, thread")
    p.add_argument("--out", type=Path, help="write the markdown report here")
    args = p.parse_args()
    sentences = test_sentences(max(args.sentences, 256))
    alone = sentences[: args.sentences]
    lines = [
        "# One sentence at a time, and at saturation: served against in-process",
        "",
        f"en-de, beam 4, {args.threads} intra-op thread(s), uncached; {len(alone)} test sentences one at a time "
        f"(each the best of {args.rounds}); saturation: {args.concurrency} connections, one sentence a request, "
        f'about {args.saturation_s:.0f} s. Milliseconds unless marked. "+ loop work": the engine alone again, '
        f"with {args.loop_work_ms:g} ms of Python on its event loop after each answer.",
        "",
        "| compute type | server's engine | in-process p50 / p95 | engine alone p50 | served p50 / p95 "
        "| served - in-process (p50) "
        "| Server-Timing p50: decode / queue / total | offline sent/s (batch 64) | engine alone sent/s at "
        "saturation | engine alone + loop work sent/s | served sent/s at saturation | served / offline "
        "| refused at saturation | load generator CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for ct in args.compute_types.split(","):
        print(f"{ct}: in process", flush=True)
        local = in_process(ct, args.threads, alone, sentences, args.rounds, args.concurrency, args.loop_work_ms / 1000)
        for engine in args.engines.split(","):
            print(f"{ct}: served, the engine in its own {engine}", flush=True)
            env = {
                "BEAMSERVE_THREADS": str(args.threads),
                "BEAMSERVE_COMPUTE_TYPE": ct,
                "BEAMSERVE_ENGINE_PROCESS": str(int(engine == "process")),
            }
            server = Server("beamserve", "haproxy", env)
            try:
                served = asyncio.run(one_at_a_time(server.port, alone, args.rounds))
                full = asyncio.run(saturated(server.port, sentences, args.concurrency, args.saturation_s))
            finally:
                server.stop()
            ms = 1000
            lines.append(
                f"| {ct} | {'own process' if engine == 'process' else 'thread of the gateway'} "
                f"| {local['p50'] * ms:.1f} / {local['p95'] * ms:.1f} | {local['engine p50'] * ms:.1f} "
                f"| {served['p50'] * ms:.1f} / {served['p95'] * ms:.1f} | {(served['p50'] - local['p50']) * ms:+.1f} "
                f"| {served['decode p50'] * ms:.1f} / {served['queue p50'] * ms:.2f} / {served['total p50'] * ms:.1f} "
                f"| {local['rate']:.1f} | {local['engine rate']:.1f} | {local['engine loaded']:.1f} "
                f"| {full['rate']:.1f} "
                f"| {full['rate'] / local['rate']:.2f} "
                f"| {full['refused']:.0f} of {full['sent']:.0f} | {full['client_cpu']:.2f} cores |"
            )
            print(lines[-1], flush=True)
    emit("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
