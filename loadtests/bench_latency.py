"""One sentence at a time, and at saturation: the server against the same model in one process.

    python loadtests/bench_latency.py                          # en-de, int8 and float32, one thread
    python loadtests/bench_latency.py --compute-types int8 --sentences 100 --saturation-s 24

For each compute type, on the same test sentences (test_2016_flickr, uncached, beam 4):
- in process (loadtests/latency_worker.py, a process as a replica's): the offline rate at batch 64
  (sentences/s); and the server's engine without the server (`Engine.translate`): the rate with
  --concurrency sentences in flight, and that rate again with --loop-work-ms of Python run on the event
  loop after each answer, as a gateway parses, tokenizes and answers a request on the loop the engine's
  thread shares the GIL with;
- one at a time: `beamserve serve --models en-de` (HAProxy in front) with the same compute type and
  intra-op threads, once per --engines placement (`process`: the engine in its own process, the
  default; `thread`: a thread of the ingress's process, BEAMSERVE_ENGINE_PROCESS=0), each sentence a
  request on one keep-alive connection, the next sent when the last is answered; beside it, in each of
  --rounds rounds, the same sentences through `Translator.translate` and the engine alone in the
  in-process worker, so that the served and the in-process times meet the machine in the same state.
  Each sentence's best of the rounds; the request's wall time at the client and its Server-Timing (the
  engine's queue wait and decoding, the gateway's total), so the difference from in-process decoding
  is split between the engine's decoding, its queue and the path around it;
- saturated: --concurrency connections sending one sentence a request, in --saturation-rounds rounds of
  --saturation-s / rounds seconds each, every round beside the offline rate and the engine alone measured
  right before it: sentences/s answered 200, and the served / offline ratio as the median of the rounds'
  (two shared cores drift by a fifth from one minute to the next, so a ratio of rates measured minutes
  apart says more of the machine than of the server); how many requests were refused (the load
  generator shares the machine's cores: its CPU time is reported beside it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import http_load  # noqa: E402
from harness import Server, quantile, test_sentences  # noqa: E402
from reports import emit  # noqa: E402


class InProcess:
    """The model and the server's engine in a process of their own (loadtests/latency_worker.py), as a replica holds
    them, timed when asked: their one-at-a-time passes alternate with the server's, so both meet the machine as it
    is then (two cores shared with other work measure a millisecond or two apart from one minute to the next)."""

    def __init__(self, compute_type: str, threads: int, alone: list[str], batched: list[str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(REPO / "loadtests" / "latency_worker.py"), compute_type, str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        self._write([alone, batched])
        self._read()  # loaded and warm

    def _write(self, message: object) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def _read(self) -> Any:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"loadtests/latency_worker.py exited with code {self.process.wait()}")
        return json.loads(line)

    def ask(self, command: object) -> Any:
        self._write(command)
        return self._read()

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


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


async def served_pass(port: int, wire: list[bytes], reconnects: list[str]) -> list[tuple[float, dict[str, float]]]:
    """Each prebuilt request in turn on a keep-alive connection: its wall time at the client and its Server-Timing.
    Where the server closes the connection (an answer saying so, as HAProxy's do while it reloads, or a kept-alive
    connection closed as the next request went out, which HTTP lets a server do and a client then sends the request
    again) the request goes again on a new one, and `reconnects` says so. The client is http_load's (a prebuilt
    request, the answer's head parsed): its own time is a small part of the wall time, on cores it shares with the
    server."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    out, used = [], False
    try:
        for i, request in enumerate(wire):
            start = time.perf_counter()
            writer.write(request)
            try:
                status, closes, answer, headers = await http_load.read_answer(reader, True)
            except asyncio.IncompleteReadError as exc:
                if exc.partial or not used:
                    raise
                reconnects.append(f"request {i}: the kept-alive connection closed before an answer")
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                start = time.perf_counter()
                writer.write(request)
                status, closes, answer, headers = await http_load.read_answer(reader, True)
            wall = time.perf_counter() - start
            if status != 200:
                raise SystemExit(f"{status}: {answer[:200]!r}")
            out.append((wall, timings(headers.get("server-timing", ""))))
            used = not closes
            if closes:
                reconnects.append(f"request {i}: the answer closed the connection")
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
    finally:
        writer.close()
    return out


def one_at_a_time(port: int, sentences: list[str], rounds: int, local: InProcess) -> dict[str, float]:
    """Each sentence alone, `rounds` times, through the server, Translator.translate and the engine without the
    server, the three passes one after the other in each round; each sentence's best of each (the served one with
    its Server-Timing), as p50s in seconds; and how many requests went again on a new connection."""
    wire = [http_load.request_bytes("/v1/translate", body(t), port=port) for t in sentences]
    reconnects: list[str] = []
    asyncio.run(served_pass(port, wire[:8], reconnects))  # warm
    served: list[tuple[float, dict[str, float]]] = [(float("inf"), {})] * len(wire)
    alone, engine = [float("inf")] * len(wire), [float("inf")] * len(wire)
    for _ in range(rounds):
        now = asyncio.run(served_pass(port, wire, reconnects))
        served = [min(pair, key=lambda x: x[0]) for pair in zip(served, now, strict=True)]
        alone = [min(pair) for pair in zip(alone, local.ask("alone"), strict=True)]
        engine = [min(pair) for pair in zip(engine, local.ask("engine"), strict=True)]
    walls = [wall for wall, _ in served]
    out = {"p50": quantile(walls, 0.5), "p95": quantile(walls, 0.95)}
    out |= {"in-process p50": quantile(alone, 0.5), "in-process p95": quantile(alone, 0.95)}
    out |= {"engine p50": quantile(engine, 0.5)}
    for name in ("queue", "decode", "total"):
        out[f"{name} p50"] = statistics.median(t.get(name, float("nan")) for _, t in served)
    for said in reconnects:
        print(f"  a new connection: {said}", flush=True)
    out["reconnects"] = len(reconnects)
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


def saturated_rounds(port: int, sentences: list[str], args: argparse.Namespace, local: InProcess) -> dict[str, Any]:
    """--saturation-rounds rounds, each the offline rate, the engine alone at saturation (without and with the
    loop work) and the served rate, one after the other: each rate's median, the served / offline ratio's median
    and range over the rounds, and the refusals and client CPU of all served passes together."""
    rounds: list[dict[str, float]] = []
    for _ in range(args.saturation_rounds):
        offline = local.ask("offline")
        alone = local.ask(["saturated", args.concurrency, args.loop_work_ms / 1000])
        served = asyncio.run(saturated(port, sentences, args.concurrency, args.saturation_s / args.saturation_rounds))
        rounds.append({"offline": offline, **alone, **served, "ratio": served["rate"] / offline})
    out: dict[str, Any] = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    out |= {k: sum(r[k] for r in rounds) for k in ("refused", "sent")}
    out["ratios"] = (min(r["ratio"] for r in rounds), max(r["ratio"] for r in rounds))
    return out


def row(
    ct: str, engine: str, args: argparse.Namespace, alone: list[str], sentences: list[str], local: InProcess
) -> str:
    """One server's row: its engine placed as `engine` says, timed one at a time beside `local`, then saturated."""
    env = {
        "BEAMSERVE_THREADS": str(args.threads),
        "BEAMSERVE_COMPUTE_TYPE": ct,
        "BEAMSERVE_ENGINE_PROCESS": str(int(engine == "process")),
    }
    server = Server("beamserve", "haproxy", env)
    try:
        served = one_at_a_time(server.port, alone, args.rounds, local)
        full = saturated_rounds(server.port, sentences, args, local)
    finally:
        server.stop()
    ms, local_p50 = 1000, served["in-process p50"]
    low, high = full["ratios"]
    again = f" ({served['reconnects']:.0f} sent again on a new connection)" if served["reconnects"] else ""
    return (
        f"| {ct} | {'own process' if engine == 'process' else 'thread of the gateway'} "
        f"| {local_p50 * ms:.1f} / {served['in-process p95'] * ms:.1f} | {served['engine p50'] * ms:.1f} "
        f"| {served['p50'] * ms:.1f} / {served['p95'] * ms:.1f}{again} | {(served['p50'] - local_p50) * ms:+.1f} "
        f"| {served['decode p50'] * ms:.1f} / {served['queue p50'] * ms:.2f} / {served['total p50'] * ms:.1f} "
        f"| {full['offline']:.1f} | {full['engine_rate']:.1f} | {full['engine_loaded']:.1f} "
        f"| {full['rate']:.1f} | {full['ratio']:.2f} ({low:.2f}-{high:.2f}) "
        f"| {full['refused']:.0f} of {full['sent']:.0f} | {full['client_cpu']:.2f} cores |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compute-types", default="int8,float32")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads, in process and in the server")
    p.add_argument("--sentences", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3, help="timings of each sentence; its best is kept")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--saturation-s", type=float, default=24.0, help="served at saturation, all rounds together")
    p.add_argument("--saturation-rounds", type=int, default=4, help="each beside the offline rate measured before it")
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
        f"about {args.saturation_s:.0f} s in {args.saturation_rounds} rounds, each beside the offline rate and the "
        "engine alone measured right before it (rates: the rounds' medians; served / offline: the median of the "
        'rounds\' ratios, their range in brackets). Milliseconds unless marked. "+ loop work": the engine alone '
        f"again, with {args.loop_work_ms:g} ms of Python on its event loop after each answer.",
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
        local = InProcess(ct, args.threads, alone, sentences)
        try:
            for engine in args.engines.split(","):
                print(f"{ct}: served, the engine in its own {engine}", flush=True)
                lines.append(row(ct, engine, args, alone, sentences, local))
                print(lines[-1], flush=True)
        finally:
            local.close()
    emit("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
