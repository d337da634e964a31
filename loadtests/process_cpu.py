"""A server's process tree: the command that starts one, the CPU seconds each role spends (psutil), for
per-request costs, and stopping it.

A role is read off a process's command line: Serve's replicas by deployment, Serve's proxy, HAProxy,
Serve's controller, and the rest of Ray (GCS, raylet, the driver, agents) together.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import psutil

from service.runtime import free_loopback_port

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
