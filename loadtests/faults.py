"""Fault and overload suite: a real `beamserve serve` on 127.0.0.1 under load while something goes wrong.

    python loadtests/faults.py                                  # every case
    python loadtests/faults.py --cases spike,replica-kill --duration 8

Cases (each on a fresh server, bounded in time, traffic to 127.0.0.1 only):
- spike: open-loop one-sentence requests at 10x the rate the server sustains (measured first by a
  closed loop of 4 clients): every answer 200, 503 or 504; refusals within a second; the accepted
  requests' p95 within 2x the unloaded p95.
- replica-kill: half the sustainable rate, the model replica SIGKILLed mid-way: no 5xx but 503/504,
  no dropped connection; answers 200 again within RECOVERY_S.
- gateway-kill: the same with the gateway (HTTP ingress) replica: its in-flight requests are cut off
  by Ray Serve's proxy; reported, and it must answer 200 again within RECOVERY_S.
- sigterm: half the sustainable rate, SIGTERM mid-way: every request accepted before the signal is
  answered; later ones get 503 or a refused connection; the process exits 0.
- slow-clients: 300 connections that send their headers and part of a body, then idle: /healthz and
  translations from other clients keep answering within 2 s, and the idle ones get 408.

Each case prints counts per status and fails (exit 1) when its check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
RECOVERY_S = 30.0  # a killed replica must be answering again within this
SENTENCES = [
    "A dog is running in the snow.",
    "Two men are sitting on a bench in the park.",
    "A woman in a red dress is singing on a stage.",
    "A little girl climbs into a wooden playhouse.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """`beamserve serve` with one pair on free loopback ports."""

    def __init__(self, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        settings = {"BEAMSERVE_MODELS": "en-de", "BEAMSERVE_REQUEST_TIMEOUT_S": "10", **env}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "service.cli",
                "serve",
                "--port",
                str(self.port),
                "--metrics-port",
                str(free_port()),
                "--num-cpus",
                "2",
            ],
            cwd=REPO,
            env={**os.environ, **settings, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening" not in line:
            self.stop()
            raise SystemExit(f"the server did not start: {line!r}")
        deadline = time.monotonic() + 60
        while httpx.get(f"{self.url}/readyz", timeout=10).status_code != 200:
            if time.monotonic() > deadline:
                raise SystemExit("the server was not ready within 60 s")
            time.sleep(0.3)

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
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@dataclass
class Outcome:
    sent: float  # seconds since the load started
    status: int  # 0: no HTTP answer (connection refused, reset or dropped)
    latency: float
    error: str = ""


@dataclass
class Load:
    outcomes: list[Outcome] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return dict(Counter(str(o.status) if o.status else f"no answer ({o.error})" for o in self.outcomes))

    def p95(self, status: int) -> float:
        times = sorted(o.latency for o in self.outcomes if o.status == status)
        return times[int(0.95 * (len(times) - 1))] if times else 0.0


async def one(client: httpx.AsyncClient, url: str, i: int, start: float, load: Load) -> None:
    sent = time.monotonic()
    body = {"texts": [SENTENCES[i % len(SENTENCES)]], "source": "en", "target": "de"}
    try:
        r = await client.post(f"{url}/v1/translate", json=body)
        load.outcomes.append(Outcome(sent - start, r.status_code, time.monotonic() - sent))
    except httpx.HTTPError as exc:
        load.outcomes.append(Outcome(sent - start, 0, time.monotonic() - sent, type(exc).__name__))


async def open_loop(url: str, rate: float, seconds: float, during: list[tuple[float, object]] | None = None) -> Load:
    """Requests at `rate` a second for `seconds` (not waiting for answers); `during` runs callables at
    the given offsets."""
    load, start = Load(), time.monotonic()
    limits = httpx.Limits(max_connections=4000, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        tasks, events = [], sorted(during or [], key=lambda e: e[0])
        i = 0
        while (now := time.monotonic() - start) < seconds:
            while events and events[0][0] <= now:
                events.pop(0)[1]()  # type: ignore[operator]
            tasks.append(asyncio.create_task(one(client, url, i, start, load)))
            i += 1
            await asyncio.sleep(max(0.0, i / rate - (time.monotonic() - start)))
        await asyncio.gather(*tasks)
    return load


async def closed_loop(url: str, clients: int, seconds: float) -> Load:
    load, start = Load(), time.monotonic()
    async with httpx.AsyncClient(timeout=30) as client:

        async def worker(k: int) -> None:
            i = k
            while time.monotonic() - start < seconds:
                await one(client, url, i, start, load)
                i += clients

        await asyncio.gather(*(worker(k) for k in range(clients)))
    return load


def sustainable(url: str) -> tuple[float, float]:
    """(requests a second a closed loop of 4 clients completes, p95 of one client alone)."""
    alone = asyncio.run(closed_loop(url, 1, 3.0))
    busy = asyncio.run(closed_loop(url, 4, 4.0))
    return sum(o.status == 200 for o in busy.outcomes) / 4.0, alone.p95(200)


def report(name: str, load: Load, extra: str = "") -> None:
    print(
        f"{name}: {len(load.outcomes)} requests, {load.counts()}; p95 of 200s {load.p95(200):.2f} s, "
        f"of 503s {load.p95(503):.2f} s{extra}",
        flush=True,
    )


def check(ok: bool, what: str, failures: list[str]) -> None:
    print(f"  {'ok  ' if ok else 'FAIL'} {what}", flush=True)
    if not ok:
        failures.append(what)


def recovered_after(load: Load, at: float) -> float | None:
    """Seconds from `at` to the first request sent after it that was answered 200."""
    later = [o.sent for o in load.outcomes if o.sent > at and o.status == 200]
    return min(later) - at if later else None


def case_spike(seconds: float, failures: list[str]) -> None:
    server = Server()
    try:
        rate, unloaded = sustainable(server.url)
        load = asyncio.run(open_loop(server.url, 10 * rate, seconds))
        report("spike", load, f"; sustainable {rate:.1f} req/s, unloaded p95 {unloaded:.2f} s, offered {10 * rate:.0f}")
        bad = [o for o in load.outcomes if o.status not in (200, 503, 504)]
        check(not bad, "every answer 200, 503 or 504, every connection answered", failures)
        check(load.p95(503) < 1.0, "refusals within 1 s (p95)", failures)
        check(load.p95(200) <= max(2 * unloaded, 0.5), "accepted p95 within 2x the unloaded p95", failures)
    finally:
        server.stop()


def case_kill(deployment: str, seconds: float, failures: list[str], *, strict: bool) -> None:
    server = Server()
    try:
        rate, _ = sustainable(server.url)
        pid = server.replica_pid(deployment)
        at = seconds / 3
        load = asyncio.run(open_loop(server.url, rate / 2, seconds, [(at, lambda: os.kill(pid, signal.SIGKILL))]))
        back = recovered_after(load, at)
        name = f"{deployment} killed"
        report(name, load, f"; answering 200 again {back:.1f} s after the kill" if back is not None else "")
        check(back is not None and back < RECOVERY_S, f"{name}: answering again within {RECOVERY_S:.0f} s", failures)
        bad = [o for o in load.outcomes if o.status not in (200, 503, 504)]
        if strict:
            check(not bad, f"{name}: no 5xx but 503/504 and no dropped connection", failures)
        else:
            print(f"  note {len(bad)} requests in flight on the killed ingress were cut off ({name})", flush=True)
    finally:
        server.stop()


def case_sigterm(seconds: float, failures: list[str]) -> None:
    server = Server()
    signalled = [0.0]
    try:
        rate, _ = sustainable(server.url)

        def term() -> None:
            signalled[0] = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)

        start = time.monotonic()
        load = asyncio.run(open_loop(server.url, rate / 2, seconds, [(seconds / 3, term)]))
        at = signalled[0] - start
        report("sigterm", load)
        before = [o for o in load.outcomes if o.sent < at - 0.2]  # sent well before the signal: accepted
        check(all(o.status == 200 for o in before), "every request accepted before SIGTERM answered 200", failures)
        after = [o for o in load.outcomes if o.sent > at + 0.5]
        check(all(o.status in (503, 0) for o in after), "later requests refused (503 or no connection)", failures)
        check(server.proc.wait(timeout=90) == 0, "the server exited 0", failures)
    finally:
        server.stop()


def case_slow_clients(seconds: float, failures: list[str]) -> None:
    server = Server(BEAMSERVE_BODY_TIMEOUT_S="3")
    socks = []
    try:
        for _ in range(300):  # headers and 8 of 100 bytes, then nothing
            s = socket.create_connection(("127.0.0.1", server.port))
            s.sendall(
                b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 100\r\n\r\n{"texts"'
            )
            socks.append(s)
        load = asyncio.run(open_loop(server.url, 4.0, seconds))
        health = [httpx.get(f"{server.url}/healthz", timeout=10) for _ in range(3)]
        report("slow clients", load)
        check(
            all(o.status == 200 for o in load.outcomes) and load.p95(200) < 2.0,
            "other clients' translations answered 200 within 2 s (p95)",
            failures,
        )
        check(all(h.status_code == 200 for h in health), "/healthz answers", failures)
        answered = 0
        for s in socks[:20]:
            s.settimeout(10)
            with contextlib.suppress(OSError):
                answered += b" 408 " in s.recv(200)
        check(answered == 20, f"idle bodies answered 408 ({answered} of 20 read)", failures)
    finally:
        for s in socks:
            s.close()
        server.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="spike,replica-kill,gateway-kill,sigterm,slow-clients")
    p.add_argument("--duration", type=float, default=12.0, help="seconds of load per case")
    args = p.parse_args()
    failures: list[str] = []
    for case in args.cases.split(","):
        print(f"== {case}", flush=True)
        if case == "spike":
            case_spike(args.duration, failures)
        elif case == "replica-kill":
            case_kill("model-en-de", args.duration, failures, strict=True)
        elif case == "gateway-kill":
            case_kill("Gateway", args.duration, failures, strict=False)
        elif case == "sigterm":
            case_sigterm(args.duration, failures)
        elif case == "slow-clients":
            case_slow_clients(args.duration, failures)
        else:
            raise SystemExit(f"unknown case {case!r}")
    print(
        f"\n{len(failures)} checks failed" + "".join(f"\n  {f}" for f in failures)
        if failures
        else "\nall checks passed"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
