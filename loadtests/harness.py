"""What the benchmarks share: a served beamserve (or a bare Serve echo) on a loopback port, its process
tree's CPU seconds by role (psutil), for per-request costs, stopping it, the test sentences, and one
quantile. Reports are loadtests/reports.py's, the HTTP load loadtests/http_load.py's.

A role is read off a process's command line: Serve's replicas by deployment, Serve's proxy, HAProxy,
Serve's controller, and the rest of Ray (GCS, raylet, the driver, agents) together.
"""

from __future__ import annotations

import gzip
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from service.runtime import free_loopback_port

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("BEAMSERVE_DATA", REPO / "tests" / "data" / "multi30k"))

Snapshot = dict[int, tuple[str, float]]  # pid -> (role, user + system CPU seconds)


def serve_command(port: int) -> list[str]:
    """`beamserve serve` on 127.0.0.1:port with 2 CPUs, its metrics on another free loopback port."""
    metrics = str(free_loopback_port())
    return [
        sys.executable,
        "-m",
        "service.cli",
        "serve",
        "--port",
        str(port),
        "--metrics-port",
        metrics,
        "--num-cpus",
        "2",
    ]


def role(cmdline: str) -> str:
    if "service.engine.engine_host" in cmdline:
        return "engine"
    if "ServeReplica:" in cmdline:
        deployment = cmdline.split("ServeReplica:", 1)[1].split()[0].split(":")[-1]
        return (
            "gateway"
            if deployment == "Gateway"
            else ("model replica" if deployment.startswith("model-") else deployment)
        )
    if "haproxy" in cmdline.split(" ", 1)[0]:
        return "HAProxy"
    if "ProxyActor" in cmdline or "HAProxyManager" in cmdline:
        return "Serve proxy"
    if "ServeController" in cmdline:
        return "Serve controller"
    return "Ray (GCS, raylet, driver, agents)"


def snapshot(root_pid: int) -> Snapshot:
    out: Snapshot = {}
    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return out
    for p in procs:
        try:
            with p.oneshot():
                t = p.cpu_times()
                out[p.pid] = (role(" ".join(p.cmdline())), t.user + t.system)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def spent(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds per role between two snapshots; a process new in `after` counts whole."""
    out: dict[str, float] = {}
    for pid, (name, seconds) in after.items():
        out[name] = out.get(name, 0.0) + seconds - (before[pid][1] if pid in before else 0.0)
    return out


def stop(proc: subprocess.Popen[str], timeout_s: float = 90.0) -> None:
    """SIGTERM (the server drains and stops Ray), then SIGKILL past timeout_s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()


def quantile(values: list[float], q: float) -> float:
    """The nearest-rank q-quantile (p95: the smallest value at or above 95% of them); nan for none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))] if ordered else math.nan


def test_sentences(n: int) -> list[str]:
    """The first n English test sentences (test_2016_flickr; BEAMSERVE_DATA names another copy)."""
    with gzip.open(DATA / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()][:n]


class Server:
    """A server on a free loopback port, ready when this returns; stop() ends it. kind: beamserve (the
    shipped en-de unless settings name models, one model thread), beamserve-split (its model in a
    deployment of its own), or echo (loadtests/serving_echo.py, what Serve itself costs a request)."""

    def __init__(
        self,
        kind: str = "beamserve",
        front: str = "haproxy",
        settings: dict[str, str] | None = None,
        *,
        every_pair: bool = False,
        ready_s: float = 180.0,
        checkout: Path | None = None,
    ) -> None:
        """settings: BEAMSERVE_* variables over the defaults; every_pair: ready once every pair answers,
        not the first; checkout: beamserve's code from this directory (another commit's worktree, its
        packages first on every process's path), not this one's."""
        self.kind, self.front, self.port = kind, front, free_loopback_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "BEAMSERVE_PROXY": front}
        env.pop("RAY_SERVE_ENABLE_HA_PROXY", None)
        env.pop("RAY_SERVE_THROUGHPUT_OPTIMIZED", None)
        if kind == "echo":  # the bare echo takes Serve's own switches; beamserve sets them from BEAMSERVE_PROXY
            if front == "haproxy":
                env |= {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}
            cmd = [sys.executable, str(REPO / "loadtests" / "serving_echo.py"), "--port", str(self.port)]
        else:
            env |= {"BEAMSERVE_MODELS": "en-de", "BEAMSERVE_THREADS": "1", **(settings or {})}
            if kind == "beamserve-split":
                env["BEAMSERVE_COLOCATE"] = "false"
            cmd = serve_command(self.port)
        if checkout is not None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(checkout), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            cmd, cwd=checkout or REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        assert self.proc.stdout is not None
        line = "-"
        while line and "listening" not in line:  # Ray may print a warning or two first
            line = self.proc.stdout.readline()
        if "listening" not in line:
            self.stop()
            raise SystemExit(f"{kind} ({front}) did not start")
        self._wait_ready(every_pair, ready_s)

    def _wait_ready(self, every_pair: bool, ready_s: float) -> None:
        deadline = time.monotonic() + ready_s
        while time.monotonic() < deadline:
            try:
                if self.kind == "echo":
                    ok = httpx.post(f"{self.url}/echo", json={}, timeout=5).status_code == 200
                else:
                    r = httpx.get(f"{self.url}/readyz", timeout=5)
                    ok = r.status_code == 200 and (
                        not every_pair or all(s == "ready" for s in r.json()["pairs"].values())
                    )
                if ok:
                    return
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.3)
        self.stop()
        raise SystemExit(f"{self.kind} ({self.front}) was not ready within {ready_s:.0f} s")

    def engine_pid(self) -> int:
        """The process of this server's engine (Settings.engine_process), the one model's."""
        for p in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                if "service.engine.engine_host" in " ".join(p.cmdline()):
                    return int(p.pid)
            except psutil.NoSuchProcess:
                continue
        raise SystemExit("no engine process found")

    def replica_pid(self, deployment: str) -> int:
        """The process of a Serve replica of this server (`model-en-de`, `Gateway`)."""
        for p in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                if f"ServeReplica:beamserve:{deployment}" in " ".join(p.cmdline()):
                    return int(p.pid)
            except psutil.NoSuchProcess:
                continue
        raise SystemExit(f"no replica of {deployment} found")

    def stop(self) -> None:
        stop(self.proc)
