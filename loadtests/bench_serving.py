"""The serving path's cost: CPU per request by process, and requests/s, for beamserve and a bare Ray
Serve echo, each behind both of Serve's HTTP fronts, in one run on the same cores.

    python loadtests/bench_serving.py --out runs/bench/serving_latest.md        # make bench-serving
    python loadtests/bench_serving.py --requests 500 --flood 0 --fronts haproxy  # a quick look

Servers (each started fresh, on loopback, one at a time):
- echo: loadtests/serving_echo.py, a FastAPI deployment answering each POST with its body: what
  Serve itself costs a request (the floor).
- beamserve: `beamserve serve` with the shipped en-de pair (float32, one model thread).
Fronts: `haproxy` (Serve's high-throughput mode: HAProxy ingress, gRPC between deployments) and
`serve` (Serve's Python HTTP proxy).

Workloads (closed loop, `--concurrency` keep-alive connections, `--requests` each, after a warm-up):
- cached-1 / cached-10: one text, or ten texts, of test sentences the gateway's cache holds.
- uncached-1 / uncached-10: the same shapes with `"cache": false` over `--sentences` distinct test
  sentences, so every sentence is decoded. The echo server gets the same bodies.
CPU is psutil's user + system time of every process of the server's tree (Ray's GCS and raylet
included) over the workload, divided by the requests answered. The load generator
(loadtests/http_load.py) runs on the same cores and is not counted.

Flood (`--flood N`, beamserve only): N connections opened at once, each sending one uncached
one-sentence request: the answers by status and the latency of the accepted and the refused.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import http_load
import process_cpu
from reports import emit

from service.runtime import free_loopback_port

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("BEAMSERVE_DATA", REPO / "tests" / "data" / "multi30k"))
FRONTS = {"haproxy": "high-throughput (HAProxy)", "serve": "Serve's Python proxy"}
WORKLOADS = ("cached-1", "cached-10", "uncached-1", "uncached-10")


def test_sentences(n: int) -> list[str]:
    with gzip.open(DATA / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()][:n]


class Server:
    """A server process on a free loopback port, ready when this returns; stop() ends it."""

    def __init__(self, kind: str, front: str) -> None:
        self.kind, self.front, self.port = kind, front, free_loopback_port()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "BEAMSERVE_PROXY": front}
        env.pop("RAY_SERVE_ENABLE_HA_PROXY", None)
        env.pop("RAY_SERVE_THROUGHPUT_OPTIMIZED", None)
        if kind == "echo":  # the bare echo takes Serve's own switches; beamserve sets them from BEAMSERVE_PROXY
            if front == "haproxy":
                env |= {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}
            cmd = [sys.executable, str(REPO / "loadtests" / "serving_echo.py"), "--port", str(self.port)]
        else:
            env |= {"BEAMSERVE_MODELS": "en-de", "BEAMSERVE_THREADS": "1"}
            cmd = [sys.executable, "-m", "service.cli", "serve", "--port", str(self.port)]
            cmd += ["--metrics-port", str(free_loopback_port()), "--num-cpus", "2"]
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        assert self.proc.stdout is not None
        line = "-"
        while line and "listening" not in line:
            line = self.proc.stdout.readline()
        if "listening" not in line:
            self.stop()
            raise SystemExit(f"{kind} ({front}) did not start")
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 120
        url = f"http://127.0.0.1:{self.port}"
        while time.monotonic() < deadline:
            try:
                if self.kind == "echo":
                    ok = httpx.post(f"{url}/echo", json={}, timeout=5).status_code == 200
                else:
                    ok = httpx.get(f"{url}/readyz", timeout=5).status_code == 200
                if ok:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise SystemExit(f"{self.kind} ({self.front}) was not ready within 120 s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@dataclass
class Row:
    server: str
    front: str
    workload: str
    requests: int
    ok: int
    seconds: float
    cpu_s: dict[str, float]

    @property
    def cpu_ms(self) -> float:
        return 1000 * sum(self.cpu_s.values()) / max(1, self.ok)

    def by_role(self) -> str:
        top = sorted(self.cpu_s.items(), key=lambda kv: -kv[1])
        return ", ".join(f"{name} {1000 * s / max(1, self.ok):.1f}" for name, s in top if s * 1000 / self.ok >= 0.05)


def bodies(workload: str, sentences: list[str]) -> list[dict[str, object]]:
    per = 10 if workload.endswith("-10") else 1
    cached = workload.startswith("cached")
    groups = [sentences[i : i + per] for i in range(0, len(sentences) - per + 1, per)]
    if cached:
        groups = groups[:1]  # the same request every time: its sentences stay in the cache
    return [{"texts": g, "source": "en", "target": "de", "cache": cached} for g in groups]


def measure(server: Server, workload: str, sentences: list[str], requests: int, concurrency: int) -> Row:
    path = "/echo" if server.kind == "echo" else "/v1/translate"
    wire = [http_load.request_bytes(path, b, port=server.port) for b in bodies(workload, sentences)]
    warm = max(concurrency * 4, requests // 10)
    asyncio.run(http_load.closed_loop(server.port, wire, total=warm, concurrency=concurrency))
    before = process_cpu.snapshot(server.proc.pid)
    answers, seconds = asyncio.run(http_load.closed_loop(server.port, wire, total=requests, concurrency=concurrency))
    spent = process_cpu.spent(before, process_cpu.snapshot(server.proc.pid))
    ok = sum(a.status == 200 for a in answers)
    if ok < len(answers):
        print(f"  {server.kind} {workload}: {http_load.counts(answers)}", file=sys.stderr)
    return Row(server.kind, server.front, workload, len(answers), ok, seconds, spent)


def flood(server: Server, sentences: list[str], connections: int) -> str:
    wire = [http_load.request_bytes("/v1/translate", b, port=server.port) for b in bodies("uncached-1", sentences)]
    answers = asyncio.run(http_load.flood(server.port, wire, connections=connections))
    refused = [a.latency_s for a in answers if a.status in (429, 503)]
    accepted = [a.latency_s for a in answers if a.status == 200]
    q = http_load.quantile
    return (
        f"| {FRONTS[server.front]} | {connections} | {http_load.counts(answers)} | "
        f"{q(refused, 0.5):.2f} / {q(refused, 0.95):.2f} | {q(accepted, 0.5):.2f} / {q(accepted, 0.95):.2f} |"
    )


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {len(os.sched_getaffinity(0))} cores"
    except OSError:
        pass
    return platform.processor() or platform.machine()


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True)
        return out.stdout.strip() + (" (uncommitted changes)" if dirty.stdout.strip() else "")
    except OSError:
        return "unknown"


def report(rows: list[Row], floods: list[str], args: argparse.Namespace) -> str:
    floor = {r.workload: r.cpu_ms for r in rows if r.server == "echo" and r.front == "haproxy"}
    lines = [
        "# Serving path: CPU per request",
        "",
        f"Command: `python loadtests/bench_serving.py {' '.join(sys.argv[1:])}`",
        f"Commit: {commit()}. CPU: {cpu_name()}; the load generator on the same cores.",
        f"{args.requests} requests per workload, {args.concurrency} in flight, after a warm-up.",
        "",
        "| server | front | workload | requests/s | CPU ms / request | x echo (HAProxy) | by process (ms / request) |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        ratio = f"{r.cpu_ms / floor[r.workload]:.2f}x" if r.workload in floor else ""
        lines.append(
            f"| {r.server} | {FRONTS[r.front]} | {r.workload} | {r.ok / r.seconds:.0f} | {r.cpu_ms:.2f} | "
            f"{ratio} | {r.by_role()} |"
        )
    if floods:
        lines += [
            "",
            "## Flood",
            "",
            "Every connection opened at once, one uncached one-sentence request each.",
            "",
            "| front | connections | answers | refused s (median / p95) | accepted s (median / p95) |",
            "|---|---:|---|---:|---:|",
            *floods,
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000, help="requests per workload")
    ap.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    ap.add_argument("--sentences", type=int, default=1000, help="distinct test sentences for uncached workloads")
    ap.add_argument("--fronts", default="haproxy,serve", help="comma-separated: haproxy, serve")
    ap.add_argument("--servers", default="echo,beamserve", help="comma-separated: echo, beamserve")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--flood", type=int, default=1500, help="connections of the flood; 0: none")
    ap.add_argument("--out", type=Path, default=None, help="also write the report here")
    args = ap.parse_args()
    sentences = test_sentences(args.sentences)
    rows: list[Row] = []
    floods: list[str] = []
    plan = [(k, f) for k in args.servers.split(",") for f in args.fronts.split(",")]
    for n, (kind, front) in enumerate(plan, 1):
        print(f"[{n}/{len(plan)}] {kind} behind {FRONTS[front]}: starting", file=sys.stderr, flush=True)
        server = Server(kind, front)
        try:
            for workload in args.workloads.split(","):
                if kind == "echo" and workload.startswith("uncached"):
                    continue  # an echo has nothing to cache: the cached rows are its floor
                row = measure(server, workload, sentences, args.requests, args.concurrency)
                rows.append(row)
                print(
                    f"  {workload}: {row.ok / row.seconds:.0f} requests/s, {row.cpu_ms:.2f} CPU ms a request "
                    f"({row.by_role()})",
                    file=sys.stderr,
                    flush=True,
                )
            if kind == "beamserve" and args.flood:
                floods.append(flood(server, sentences, args.flood))
                print(f"  flood: {floods[-1]}", file=sys.stderr, flush=True)
        finally:
            server.stop()
    emit(report(rows, floods, args), args.out)


if __name__ == "__main__":
    main()
