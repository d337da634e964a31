"""A server's start: the CPU every process of `beamserve serve` spends until /readyz answers 200, and the
seconds to that; with the installed packages' bytecode, and with none (as in an environment where
nothing wrote it and PYTHONDONTWRITEBYTECODE is set).

    python loadtests/bench_start.py --out runs/bench/start.md
    python loadtests/bench_start.py --models en-de --rounds 5

"No bytecode" points Python's bytecode cache at an empty folder (PYTHONPYCACHEPREFIX) with writing
off, for the server and every Ray process it starts: each compiles what it imports from source, as
where the packages were installed without compiling them. The two take turns, round by round; the
median round is reported. Servers listen on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
import reports

from service.runtime import free_loopback_port

REPO = Path(__file__).resolve().parents[1]


def start(models: str, env: dict[str, str], timeout_s: float = 300.0) -> tuple[float, dict[str, float]]:
    """(seconds to ready, CPU-s to ready by role) of one server, stopped after."""
    port = free_loopback_port()
    t0 = time.monotonic()
    proc = subprocess.Popen(
        harness.serve_command(port),
        cwd=REPO,
        env={**os.environ, **env, "BEAMSERVE_MODELS": models},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    seen: harness.Snapshot = {}  # each process's latest CPU, those that have exited included
    try:
        while True:
            seen.update(harness.snapshot(proc.pid))
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() - t0 > timeout_s:
                raise RuntimeError(f"the server did not become ready (exit code {proc.poll()})")
            time.sleep(0.2)
        ready_s = time.monotonic() - t0
        seen.update(harness.snapshot(proc.pid))
    finally:
        harness.stop(proc)
    return ready_s, harness.spent({}, seen)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="en-de,en-fr", help="BEAMSERVE_MODELS of the server")
    ap.add_argument("--rounds", type=int, default=3, help="starts of each kind; the median is reported")
    ap.add_argument("--out", type=Path, help="also write the report here")
    args = ap.parse_args()
    empty = tempfile.mkdtemp(prefix="beamserve-no-bytecode-")
    kinds = {
        "installed bytecode": {},
        "no bytecode": {"PYTHONPYCACHEPREFIX": empty, "PYTHONDONTWRITEBYTECODE": "1"},
    }
    runs: dict[str, list[tuple[float, float, dict[str, float]]]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for kind, env in kinds.items():
            ready_s, by_role = start(args.models, env)
            runs[kind].append((ready_s, sum(by_role.values()), by_role))
            print(f"  {kind} round {r + 1}/{args.rounds}: ready in {ready_s:.1f} s, {runs[kind][-1][1]:.1f} CPU-s")
    lines = [
        "# Server start: CPU and time to ready",
        "",
        f"`beamserve serve` with BEAMSERVE_MODELS={args.models} on 2 CPUs, from its start until /readyz answers 200;"
        f" {args.rounds} rounds, the kinds taking turns, the median shown.",
        "",
        "| bytecode | ready s | CPU-s to ready | CPU-s to ready by role (the median round's) |",
        "|---|---:|---:|---|",
    ]
    for kind, rows in runs.items():
        median = sorted(rows, key=lambda row: row[1])[len(rows) // 2]
        roles = ", ".join(f"{name} {s:.1f}" for name, s in sorted(median[2].items(), key=lambda kv: -kv[1]))
        lines.append(f"| {kind} | {statistics.median(r[0] for r in rows):.1f} | {median[1]:.1f} | {roles} |")
    lines += [
        "",
        "CPU: user + system seconds of every process of the server's tree (psutil, sampled every 0.2 s; a"
        " process's last sample counts). Roles: loadtests/harness.py.",
    ]
    reports.emit("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
