"""The serving path's cost: CPU per request by process, and requests/s, for beamserve and a bare Ray
Serve echo, each behind both of Serve's HTTP fronts, in one run on the same cores.

    python loadtests/bench_serving.py --out runs/bench/serving_latest.md        # make bench-serving
    python loadtests/bench_serving.py --requests 500 --flood 0 --fronts haproxy  # a quick look

Servers (started fresh on loopback for each front, side by side, taking turns workload by workload):
- echo: loadtests/serving_echo.py, a FastAPI deployment answering each POST with its body: what
  Serve itself costs a request (the floor).
- beamserve: `beamserve serve` with the shipped en-de pair (float32, one model thread): one model, so
  the ingress holds it (Settings.colocate).
- beamserve-split: the same with BEAMSERVE_COLOCATE=false: the model in a deployment of its own, as
  each model of a registry of several is, called through a Serve handle.
Fronts: `haproxy` (Serve's high-throughput mode: HAProxy ingress, gRPC between deployments) and
`serve` (Serve's Python HTTP proxy).

Workloads (closed loop, `--concurrency` keep-alive connections, `--requests` each, after a warm-up;
each in `--rounds` rounds, the servers taking turns, the median round reported):
- cached-1 / cached-10: one text, or ten texts, of test sentences the gateway's cache holds.
- uncached-1 / uncached-10: the same shapes with `"cache": false` over `--sentences` distinct test
  sentences, so every sentence is decoded (UNCACHED_IN_FLIGHT in flight, fewer requests), in rounds
  too. The echo server gets the cached bodies; its CPU per request is the floor each path is
  compared with. Behind HAProxy the echo also runs each uncached row's shape at that row's pace (its
  requests/s, UNCACHED_IN_FLIGHT connections, http_load.paced_loop): what a request costs Serve
  depends on the rate (at a low one each request wakes every process on its way by itself: the
  report's paced echo rows against its flat-out ones), so an uncached row's floor is the echo at the
  same rate.
CPU is psutil's user + system time of every process of the server's tree (Ray's GCS and raylet
included) over the workload, less what each process spends idle (measured for IDLE_S before it),
divided by the requests answered. The engine's share is its thread's CPU (`engine_cpu_s` of
/v1/stats, read before and after): the decoding, wherever the engine runs. Path CPU is the rest. The
load generator (loadtests/http_load.py) runs on the same cores and is not counted.

Flood (`--flood N`, beamserve only): N connections opened at once, each sending one uncached
one-sentence request: the answers by status and the latency of the accepted and the refused.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Coroutine
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
import http_load
from harness import Server, test_sentences
from reports import emit, provenance

FRONTS = {"haproxy": "high-throughput (HAProxy)", "serve": "Serve's Python proxy"}
WORKLOADS = ("cached-1", "cached-10", "uncached-1", "uncached-10")
IDLE_S = 5.0  # seconds the server's idle CPU is measured for, before each workload
UNCACHED_IN_FLIGHT = 2  # uncached requests in flight: under the engine's admission bound, none refused


@dataclass
class Row:
    server: str
    front: str
    workload: str
    requests: int
    ok: int
    seconds: float
    cpu_s: dict[str, float]
    engine_s: float = 0.0  # the engine thread's CPU seconds over the workload
    round: int = 0
    pace_of: str = ""  # an echo row held to this server's pace on the workload (its requests/s)

    @property
    def cpu_ms(self) -> float:
        return 1000 * sum(self.cpu_s.values()) / max(1, self.ok)

    @property
    def engine_ms(self) -> float:
        return 1000 * self.engine_s / max(1, self.ok)

    @property
    def path_ms(self) -> float:
        """CPU a request costs outside the engine's decoding."""
        return self.cpu_ms - self.engine_ms

    def by_role(self) -> str:
        top = sorted(self.cpu_s.items(), key=lambda kv: -kv[1])
        per = [(name, 1000 * s / max(1, self.ok)) for name, s in top]
        return ", ".join(f"{name} {ms:.1f}" for name, ms in per if ms >= 0.05)


def bodies(workload: str, sentences: list[str]) -> list[dict[str, object]]:
    per = 10 if workload.endswith("-10") else 1
    cached = workload.startswith("cached")
    groups = [sentences[i : i + per] for i in range(0, len(sentences) - per + 1, per)]
    if cached:
        groups = groups[:1]  # the same request every time: its sentences stay in the cache
    return [{"texts": g, "source": "en", "target": "de", "cache": cached} for g in groups]


def measure(server: Server, workload: str, sentences: list[str], requests: int, concurrency: int) -> Row:
    if workload.startswith("uncached"):  # the model's own pace: few in flight, fewer requests
        requests, concurrency = requests // (5 if workload.endswith("-1") else 20), UNCACHED_IN_FLIGHT
    path = "/echo" if server.kind == "echo" else "/v1/translate"
    wire = [http_load.request_bytes(path, b, port=server.port) for b in bodies(workload, sentences)]
    warm = max(concurrency * 4, requests // 10)
    asyncio.run(http_load.closed_loop(server.port, wire, total=warm, concurrency=concurrency))
    return counted(server, workload, http_load.closed_loop(server.port, wire, total=requests, concurrency=concurrency))


def measure_paced(echo: Server, row: Row, sentences: list[str]) -> Row:
    """The echo on row's shape, held to row's requests/s over as many connections and requests."""
    rate, cached = row.ok / row.seconds, row.workload.replace("uncached", "cached")
    wire = [http_load.request_bytes("/echo", b, port=echo.port) for b in bodies(cached, sentences)]
    asyncio.run(http_load.closed_loop(echo.port, wire, total=UNCACHED_IN_FLIGHT * 4, concurrency=UNCACHED_IN_FLIGHT))
    load = http_load.paced_loop(echo.port, wire, total=row.requests, concurrency=UNCACHED_IN_FLIGHT, rate=rate)
    return replace(counted(echo, row.workload, load), round=row.round, pace_of=row.server)


def counted(server: Server, workload: str, load: Coroutine[Any, Any, tuple[list[http_load.Answer], float]]) -> Row:
    """The row of `load` (a loop of http_load's) run on the server: each role's CPU less what it spends
    idle (measured just before), and the engine thread's CPU."""
    idle = idle_rate(server)
    engine = engine_cpu_s(server)
    before = harness.snapshot(server.proc.pid)
    answers, seconds = asyncio.run(load)
    spent = harness.spent(before, harness.snapshot(server.proc.pid))
    engine = engine_cpu_s(server) - engine
    # What the server spends with no request (Ray's and Serve's loops) is not a request's cost; a role
    # whose idle rate moved more than the requests added is counted at nothing, not below.
    spent = {name: max(0.0, cpu - idle.get(name, 0.0) * seconds) for name, cpu in spent.items()}
    ok = sum(a.status == 200 for a in answers)
    if ok < len(answers):
        print(f"  {server.kind} {workload}: {http_load.counts(answers)}", file=sys.stderr)
    return Row(server.kind, server.front, workload, len(answers), ok, seconds, spent, engine)


def engine_cpu_s(server: Server) -> float:
    """CPU seconds the server's engine threads have spent (0 for the echo)."""
    if server.kind == "echo":
        return 0.0
    stats = httpx.get(f"http://127.0.0.1:{server.port}/v1/stats", timeout=10).json()
    return float(sum(pair["engine_cpu_s"] for pair in stats.values()))


def idle_rate(server: Server, seconds: float = IDLE_S) -> dict[str, float]:
    """CPU seconds a second each role spends with no request in flight."""
    before = harness.snapshot(server.proc.pid)
    time.sleep(seconds)
    spent = harness.spent(before, harness.snapshot(server.proc.pid))
    return {name: cpu / seconds for name, cpu in spent.items()}


def flood(server: Server, sentences: list[str], connections: int) -> str:
    wire = [http_load.request_bytes("/v1/translate", b, port=server.port) for b in bodies("uncached-1", sentences)]
    answers = asyncio.run(http_load.flood(server.port, wire, connections=connections))
    refused = [a.latency_s for a in answers if a.status in (429, 503)]
    accepted = [a.latency_s for a in answers if a.status == 200]
    q = harness.quantile
    return (
        f"| {server.kind} | {FRONTS[server.front]} | {connections} | {http_load.counts(answers)} | "
        f"{q(refused, 0.5):.2f} / {q(refused, 0.95):.2f} | {q(accepted, 0.5):.2f} / {q(accepted, 0.95):.2f} |"
    )


def ratio_to_echo(row: Row, rows: list[Row], *, paced: bool) -> float | None:
    """The row's path CPU over the HAProxy echo's CPU on the same body: round by round where both ran
    in the round, the median of the ratios. Flat out (paced False): the echo's closed loop on the
    cached workload of the row's shape; an uncached row, or one behind the other front, against the
    echo's median round. Paced: an uncached row behind HAProxy against the echo held to its pace in
    its round (None behind the other front); a cached row's pace is flat out already."""
    uncached = row.workload.startswith("uncached")
    if paced and uncached and row.front != "haproxy":
        return None
    # The echo's rows it is set against: held to this row's pace, or the cached workload flat out.
    workload, pace_of = (
        (row.workload, row.server) if paced and uncached else (row.workload.replace("uncached", "cached"), "")
    )
    floor = {
        r.round: r.cpu_ms
        for r in rows
        if (r.server, r.front, r.workload, r.pace_of) == ("echo", "haproxy", workload, pace_of)
    }
    if not floor:
        return None
    mine = [r for r in rows if (r.server, r.front, r.workload, r.pace_of) == (row.server, row.front, row.workload, "")]
    if row.front == "haproxy" and (paced or not uncached):
        ratios = sorted(r.path_ms / floor[r.round] for r in mine if r.round in floor)
    else:  # measured once, or behind the other front: against the echo's median round
        echo = sorted(floor.values())[len(floor) // 2]
        ratios = sorted(r.path_ms / echo for r in mine)
    return ratios[len(ratios) // 2] if ratios else None


def report(rows: list[Row], floods: list[str], args: argparse.Namespace) -> str:
    lines = [
        "# Serving path: CPU per request",
        "",
        f"{provenance()} The load generator on the same cores.",
        f"{args.requests} requests per workload, {args.concurrency} in flight, after a warm-up; every workload"
        f" in {args.rounds} rounds, the servers taking turns, the median round shown.",
        "",
        "| server | front | workload | requests/s | CPU ms / request | engine ms | path CPU ms |"
        " path / echo at its pace | path / echo flat out | by process (ms / request) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in median_rows(rows):
        ratios = [ratio_to_echo(r, rows, paced=paced) if not r.pace_of else None for paced in (True, False)]
        shown = " | ".join(f"{x:.2f}x" if x is not None else "" for x in ratios)
        workload = f"{r.workload}, {r.pace_of}'s pace" if r.pace_of else r.workload
        lines.append(
            f"| {r.server} | {FRONTS[r.front]} | {workload} | {r.ok / r.seconds:.0f} | {r.cpu_ms:.2f} | "
            f"{r.engine_ms:.2f} | {r.path_ms:.2f} | {shown} | {r.by_role()} |"
        )
    lines += [
        "",
        "CPU: every process of the server, less its idle CPU over the same time. Engine: the engine thread's CPU",
        "(its decoding), in whichever process it runs. Path CPU: the rest. Path / echo: over the HAProxy echo's",
        "CPU on the same body, round by round (the median ratio). At its pace: an uncached row against the echo",
        "held to that row's requests/s in the same round (the echo rows marked with a server's pace), since a",
        "request costs Serve more CPU the fewer come a second; a cached row's pace is flat out. Flat out: against",
        "the echo's closed loop at full speed (uncached rows against its median round).",
        f"Uncached workloads run {UNCACHED_IN_FLIGHT} requests in flight and a fifth (one sentence) or a twentieth",
        "(ten sentences) of the requests.",
    ]
    if floods:
        lines += [
            "",
            "## Flood",
            "",
            "Every connection opened at once, one uncached one-sentence request each.",
            "",
            "| server | front | connections | answers | refused s (median / p95) | accepted s (median / p95) |",
            "|---|---|---:|---|---:|---:|",
            *floods,
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000, help="requests per workload and round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each workload; the median is reported")
    ap.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    ap.add_argument("--sentences", type=int, default=1000, help="distinct test sentences for uncached workloads")
    ap.add_argument("--fronts", default="haproxy,serve", help="comma-separated: haproxy, serve")
    ap.add_argument(
        "--servers", default="echo,beamserve,beamserve-split", help="comma-separated: echo, beamserve, beamserve-split"
    )
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--flood", type=int, default=1500, help="connections of the flood; 0: none")
    ap.add_argument("--out", type=Path, default=None, help="also write the report here")
    args = ap.parse_args()
    sentences = test_sentences(args.sentences)
    rows: list[Row] = []
    floods: list[str] = []
    workloads = args.workloads.split(",")
    for n, front in enumerate(args.fronts.split(","), 1):
        # The servers of a front run side by side and take turns, workload by workload, round by round:
        # a drift of the machine's speed touches both sides of each ratio alike.
        print(f"[{n}] {args.servers} behind {FRONTS[front]}: starting", file=sys.stderr, flush=True)
        servers = [Server(kind, front) for kind in args.servers.split(",")]
        echo = next((s for s in servers if s.kind == "echo"), None)
        try:
            for r in range(args.rounds):
                for workload in workloads:
                    for server in servers:
                        if server.kind == "echo" and workload.startswith("uncached"):
                            continue  # the echo's floors are its cached row and its paced runs
                        rows.append(measure(server, workload, sentences, args.requests, args.concurrency))
                        rows[-1].round = r
                        say(rows[-1], f"round {r + 1}/{args.rounds}")
                        if echo is not None and front == "haproxy" and workload.startswith("uncached"):
                            rows.append(measure_paced(echo, rows[-1], sentences))
                            say(rows[-1], f"round {r + 1}/{args.rounds}, {server.kind}'s pace")
            for server in (s for s in servers if s.kind != "echo"):
                if args.flood:
                    floods.append(flood(server, sentences, args.flood))
                    print(f"  flood: {floods[-1]}", file=sys.stderr, flush=True)
        finally:
            for server in servers:
                server.stop()
    emit(report(rows, floods, args), args.out)


def say(row: Row, when: str) -> None:
    print(
        f"  {row.server} {row.workload} {when}: {row.ok / row.seconds:.0f} requests/s, {row.cpu_ms:.2f} CPU ms a"
        f" request ({row.by_role()})",
        file=sys.stderr,
        flush=True,
    )


def median_rows(rows: list[Row]) -> list[Row]:
    """Per server, front and workload, the round with the median CPU a request."""
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for row in rows:
        groups.setdefault((row.server, row.front, row.workload + row.pace_of), []).append(row)
    return [sorted(g, key=lambda r: r.cpu_ms)[len(g) // 2] for g in groups.values()]


if __name__ == "__main__":
    main()
