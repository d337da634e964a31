"""Fault and overload suite: a real `beamserve serve` on 127.0.0.1 under load while something goes wrong.

    python loadtests/faults.py                                  # every case
    python loadtests/faults.py --cases spike,replica-kill --duration 8

Servers serve the shipped en-de: one model, so by default the ingress holds it (Settings.colocate).
replica-kill, gateway-kill and slow-clients share one server with the model in a deployment of its
own (BEAMSERVE_COLOCATE=false, as each model of a registry of several is), in that order, each after
the last has recovered; every other case has a fresh server in the default layout. Without the first
two, the shared server has the default layout and colocated-kill runs on it after slow-clients.

Cases (bounded in time, traffic to 127.0.0.1 only):
- spike: open-loop one-sentence requests at 10x the rate the server sustains (measured first by a
  closed loop of 4 clients): every answer 200, 503 or 504; refusals within a second; the accepted
  requests' p95 within 2x the unloaded p95 (or 0.5 s), with max_queue_wait_s 0.1 (--spike-queue-wait).
- replica-kill: half the sustainable rate, the model replica SIGKILLed mid-way: no 5xx but 503/504,
  no dropped connection; answers 200 again within RECOVERY_S.
- gateway-kill: the same with the gateway (HTTP ingress) replica: the requests in flight on it are sent
  again by the front (service/api/front.py) or get a JSON 503 with Retry-After, none a 500.
- engine-kill: the same with the engine's own process (service/engine/engine_process.py): the requests
  it held are asked again by the gateway, and wait with the new ones for the fresh engine it starts.
- colocated-kill: the same with the one replica of the default layout, ingress and model together:
  the front holds requests until Serve has started another that has loaded the model, or answers a
  JSON 503 with Retry-After; none a 500.
- sigterm: half the sustainable rate (or, with --sigterm-clients N, a closed loop of N clients), SIGTERM
  a third of the way in: every request sent before the signal is answered 200; later ones get 503 or a
  refused connection; the process exits 0. `--cases sigterm --sigterm-clients 24 --repeat 5` runs it on
  five fresh servers.
- slow-clients: 300 connections that send their headers and part of a body, then idle: /healthz and
  translations from other clients keep answering within 2 s, and the idle ones get 408.
- soak (not in the default set; `--cases soak --duration 3600`): mixed traffic and fuzzing from a few
  closed-loop clients (every route and option, HTML, n-best lists, tiny timeouts, clients that hang
  up, malformed and hostile bodies); never a 5xx other than 503/504, and the resident memory of each
  Serve replica at the end within 10% of its value after the warm-up (one request that takes the
  decode pool to its configured size, then the first tenth of the run).

Each case prints counts per status and fails (exit 1) when its check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import os
import random
import signal
import socket
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
import http_load
from reports import recorded

REPO = Path(__file__).resolve().parents[1]
RECOVERY_S = 30.0  # a killed replica must be answering again within this
SENTENCES = [
    "A dog is running in the snow.",
    "Two men are sitting on a bench in the park.",
    "A woman in a red dress is singing on a stage.",
    "A little girl climbs into a wooden playhouse.",
]


class Server(harness.Server):
    """`beamserve serve` with one pair on free loopback ports, its requests' timeout 10 s unless env says."""

    def __init__(self, **env: str) -> None:
        super().__init__("beamserve", "haproxy", {"BEAMSERVE_REQUEST_TIMEOUT_S": "10", **env}, ready_s=60)
        self.split = env.get("BEAMSERVE_COLOCATE") == "false"  # the model in a deployment of its own
        self._rate: float | None = None

    def rate(self) -> float:
        """The throughput of a closed loop (throughput()), measured once: the cases sharing a server
        each begin once the last has recovered, at the same rate."""
        if self._rate is None:
            self._rate = throughput(self.url)
        return self._rate


@dataclass
class Outcome:
    sent: float  # seconds since the load started
    status: int  # 0: no HTTP answer (connection refused, reset or dropped)
    latency: float
    error: str = ""  # the exception when there was no answer
    body: str = ""  # the answer's body when it was not 200
    retry_after: str | None = None


@dataclass
class Load:
    outcomes: list[Outcome] = field(default_factory=list)
    start: float = field(default_factory=time.monotonic)  # what each outcome's `sent` counts from

    def counts(self) -> dict[str, int]:
        return dict(Counter(str(o.status) if o.status else f"no answer ({o.error})" for o in self.outcomes))

    def p95(self, status: int) -> float:
        times = sorted(o.latency for o in self.outcomes if o.status == status)
        return times[int(0.95 * (len(times) - 1))] if times else 0.0


def translation(port: int, i: int) -> bytes:
    """The i-th request of a load: one sentence, past the gateway's cache (every request costs the model
    its decoding)."""
    body = {"texts": [SENTENCES[i % len(SENTENCES)]], "source": "en", "target": "de", "cache": False}
    return http_load.request_bytes("/v1/translate", body, port=port)


async def one(port: int, i: int, start: float, load: Load) -> None:
    sent = time.monotonic()
    # A connection of its own, like an independent client; the lean client leaves the cores to the server.
    a = await http_load.request(port, translation(port, i), timeout_s=30)
    body = a.body.decode("utf-8", "replace")[:500]
    load.outcomes.append(Outcome(sent - start, a.status, a.latency_s, a.error, body, a.headers.get("retry-after")))


async def open_loop(url: str, rate: float, seconds: float, during: list[tuple[float, object]] | None = None) -> Load:
    """Requests at `rate` a second for `seconds` (not waiting for answers); `during` runs callables at
    the given offsets."""
    load = Load()
    start, port = load.start, int(url.rsplit(":", 1)[1])
    tasks, events = [], sorted(during or [], key=lambda e: e[0])
    i = 0
    while (now := time.monotonic() - start) < seconds:
        while events and events[0][0] <= now:
            events.pop(0)[1]()  # type: ignore[operator]
        tasks.append(asyncio.create_task(one(port, i, start, load)))
        i += 1
        await asyncio.sleep(max(0.0, i / rate - (time.monotonic() - start)))
    await asyncio.gather(*tasks)
    return load


async def closed_loop(url: str, clients: int, seconds: float, during: list[tuple[float, object]] | None = None) -> Load:
    """`clients` each sending its next request once the last is answered, for `seconds`; `during` runs
    callables at the given offsets."""
    load = Load()
    start, port = load.start, int(url.rsplit(":", 1)[1])

    async def worker(k: int) -> None:
        i = k
        while time.monotonic() - start < seconds:
            await one(port, i, start, load)
            i += clients

    async def events() -> None:
        for at, action in sorted(during or [], key=lambda e: e[0]):
            await asyncio.sleep(max(0.0, at - (time.monotonic() - start)))
            action()  # type: ignore[operator]

    await asyncio.gather(events(), *(worker(k) for k in range(clients)))
    return load


def throughput(url: str) -> float:
    """Requests a second a closed loop of 4 clients completes (200s only)."""
    busy = asyncio.run(closed_loop(url, 4, 4.0))
    return sum(o.status == 200 for o in busy.outcomes) / 4.0


def sustainable(url: str) -> tuple[float, float]:
    """(throughput, p95 of one client alone)."""
    alone = asyncio.run(closed_loop(url, 1, 3.0))
    return throughput(url), alone.p95(200)


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


def summarise(failures: list[str]) -> None:
    """The run's last lines: the checks that failed, or that all passed."""
    print(
        f"\n{len(failures)} checks failed" + "".join(f"\n  {f}" for f in failures)
        if failures
        else "\nall checks passed"
    )


def recovered_after(load: Load, at: float) -> float | None:
    """Seconds from `at` to the first request sent after it that was answered 200."""
    later = [o.sent for o in load.outcomes if o.sent > at and o.status == 200]
    return min(later) - at if later else None


def case_spike(seconds: float, failures: list[str], factor: float = 10.0, queue_wait_s: float = 0.1) -> None:
    # The latency-tuned admission the check holds accepted requests to (docs/operations.md, "Tuning for
    # latency under overload"): at the default 1 s, admitted work may wait a second by design.
    server = Server(BEAMSERVE_MAX_QUEUE_WAIT_S=str(queue_wait_s))
    try:
        rate, unloaded = sustainable(server.url)
        load = asyncio.run(open_loop(server.url, factor * rate, seconds))
        extra = (
            f"; sustainable {rate:.1f} req/s, unloaded p95 {unloaded:.2f} s, offered {factor * rate:.0f} ({factor:g}x)"
            f", max_queue_wait_s {queue_wait_s:g}"
        )
        report("spike", load, extra)
        bad = [o for o in load.outcomes if o.status not in (200, 503, 504)]
        check(not bad, "every answer 200, 503 or 504, every connection answered", failures)
        check(load.p95(503) < 1.0, "refusals within 1 s (p95)", failures)
        check(load.p95(200) <= max(2 * unloaded, 0.5), "accepted p95 within 2x the unloaded p95", failures)
    finally:
        server.stop()


def json_error(body: str) -> bool:
    try:
        answer = json.loads(body)
    except ValueError:
        return False
    return isinstance(answer, dict) and bool(answer.get("error")) and bool(answer.get("request_id"))


SHARED_ORDER = ("replica-kill", "gateway-kill", "slow-clients", "engine-kill")
CASES = ("spike", *SHARED_ORDER, "colocated-kill", "sigterm", "soak")


def case_kill(server: Server, deployment: str, seconds: float, failures: list[str]) -> None:
    """`deployment`'s replica killed, or with deployment "engine" the engine's own process in the replica."""
    rate = server.rate()
    pid = server.engine_pid() if deployment == "engine" else server.replica_pid(deployment)
    at = seconds / 3
    load = asyncio.run(open_loop(server.url, rate / 2, seconds, [(at, lambda: os.kill(pid, signal.SIGKILL))]))
    back = recovered_after(load, at)
    name = "the engine's process killed" if deployment == "engine" else f"{deployment} killed"
    report(name, load, f"; answering 200 again {back:.1f} s after the kill" if back is not None else "")
    check(back is not None and back < RECOVERY_S, f"{name}: answering again within {RECOVERY_S:.0f} s", failures)
    bad = [o for o in load.outcomes if o.status not in (200, 503, 504)]
    check(not bad, f"{name}: no 5xx but 503/504 and no dropped connection", failures)
    refused = [o for o in load.outcomes if o.status == 503]
    check(
        all(json_error(o.body) and o.retry_after for o in refused),
        f"{name}: every 503 a JSON error with its request id and Retry-After",
        failures,
    )


def case_sigterm(seconds: float, failures: list[str], clients: int = 0) -> None:
    """SIGTERM a third of the way into half the sustainable rate, or into a closed loop of `clients`."""
    server = Server()
    signalled = [0.0]
    try:

        def term() -> None:
            signalled[0] = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)

        if clients:
            load = asyncio.run(closed_loop(server.url, clients, seconds, [(seconds / 3, term)]))
        else:
            load = asyncio.run(open_loop(server.url, server.rate() / 2, seconds, [(seconds / 3, term)]))
        at = signalled[0] - load.start
        dropped = [o.sent - at for o in load.outcomes if o.status == 0 and "Refused" not in o.error]
        extra = (
            f"; connections closed unanswered: {len(dropped)}, sent {min(dropped):+.2f} to {max(dropped):+.2f} s"
            " from the signal"
            if dropped
            else ""
        )
        report(f"sigterm ({f'{clients} clients' if clients else 'open loop'})", load, extra)
        before = [o for o in load.outcomes if o.sent < at - 0.2]  # sent well before the signal: accepted
        check(all(o.status == 200 for o in before), "every request accepted before SIGTERM answered 200", failures)
        sent = [o for o in load.outcomes if o.sent < at]  # the last 0.2 s: reaching the front as it starts to drain
        lost = [o for o in sent if not (o.status == 200 or (o.status == 503 and json_error(o.body)))]
        check(not lost, f"no request sent before SIGTERM lost: each 200 or a JSON 503 ({len(lost)} not)", failures)
        after = [o for o in load.outcomes if o.sent > at + 0.5]
        check(all(o.status in (503, 0) for o in after), "later requests refused (503 or no connection)", failures)
        check(server.proc.wait(timeout=90) == 0, "the server exited 0", failures)
    finally:
        server.stop()


def case_slow_clients(server: Server, seconds: float, failures: list[str]) -> None:
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


def fuzz_body(rng: random.Random, sentences: list[str]) -> tuple[str, dict[str, str], bytes]:
    """(path, headers, body) of one request of the soak's mix: valid traffic on every route and option,
    and inputs a hostile or broken client sends."""
    texts = rng.sample(sentences, rng.randint(1, 6))
    kind = rng.random()
    js = {"Content-Type": "application/json"}
    if kind < 0.40:  # the API, with options
        body: object = {"texts": texts, "source": "en", "target": "de"}
        opts = {
            "beam_size": rng.randint(1, 5),
            "num_hypotheses": 1,
            "length_penalty": rng.uniform(0, 2),
            "no_repeat_ngram_size": rng.choice([0, 0, 3]),
            "split_sentences": rng.random() < 0.8,
            "cache": rng.random() < 0.5,
        }
        opts["num_hypotheses"] = rng.randint(1, int(opts["beam_size"]))
        if rng.random() < 0.1:
            opts["timeout_s"] = 0.01  # answered 504
        return "/v1/translate", js, json.dumps(body | opts).encode()
    if kind < 0.50:  # HTML with nested inline markup, both routes
        html = " ".join(f"<p>{t.replace(' ', ' <b>', 1)}</b> <i>x</i></p>" for t in texts)
        if rng.random() < 0.5:
            return (
                "/v1/translate",
                js,
                json.dumps({"texts": [html], "source": "en", "target": "de", "tag_handling": "html"}).encode(),
            )
        return "/translate", js, json.dumps({"q": html, "source": "en", "target": "de", "format": "html"}).encode()
    if kind < 0.65:  # LibreTranslate, JSON and form, alternatives
        if rng.random() < 0.5:
            body = {
                "q": texts if rng.random() < 0.5 else texts[0],
                "source": "en",
                "target": "de",
                "alternatives": rng.randint(0, 3),
            }
            return "/translate", js, json.dumps(body).encode()
        form = urlencode({"q": texts, "source": "en", "target": "de"}, doseq=True)
        return "/translate", {"Content-Type": "application/x-www-form-urlencoded"}, form.encode()
    # Hostile or broken input: every one must get a 4xx.
    hostile: list[bytes] = [
        bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 400))),
        b"[" * rng.randint(1000, 50000),
        json.dumps({"texts": ["x" * rng.randint(1, 50000)], "source": "en", "target": "de"}).encode(),
        json.dumps(
            {"texts": texts, "source": "en", "target": "de", "beam_size": rng.choice([0, -1, 10**9, 2.5, "4", True])}
        ).encode(),
        json.dumps({"texts": texts, "source": "en", "target": "xx"}).encode(),
        json.dumps({"texts": [], "source": "en", "target": "de"}).encode(),
        json.dumps(
            {"texts": ["".join(chr(rng.randint(1, 0x2FFF)) for _ in range(200))], "source": "en", "target": "de"}
        ).encode(),
        b'{"q": "a", "source": "en", "target": "de", "alternatives": 1e999}',
        json.dumps({"q": "<b>" * rng.randint(200, 20000), "source": "en", "target": "de", "format": "html"}).encode(),
        json.dumps({"texts": texts, "source": "en", "target": "de", "length_penalty": "NaN"}).encode(),
    ]
    return rng.choice(["/v1/translate", "/translate"]), js, rng.choice(hostile)


def case_soak(seconds: float, failures: list[str]) -> None:
    with gzip.open(REPO / "tests/data/multi30k/test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip()]
    # A translation cache small enough to reach its bound before the warm-up mark (about 3,000
    # entries): the gateway's baseline then holds a full cache, and the hour checks that eviction
    # keeps it there. At the default 64 MB the cache would still be filling at the end.
    server = Server(BEAMSERVE_REQUEST_TIMEOUT_S="120", BEAMSERVE_CACHE_BYTES="4000000")
    statuses: Counter[str] = Counter()
    unexpected: list[str] = []
    try:
        pids = {d: server.replica_pid(d) for d in (("model-en-de", "Gateway") if server.split else ("Gateway",))}
        procs = {d: psutil.Process(pid) for d, pid in pids.items()}

        def rss() -> dict[str, float]:
            return {d: p.memory_info().rss / 2**20 for d, p in procs.items()}

        async def client(k: int, until: float) -> None:
            rng = random.Random(k)
            async with httpx.AsyncClient(base_url=server.url) as http:
                while time.monotonic() < until:
                    path, headers, body = fuzz_body(rng, sentences)
                    hang_up = rng.random() < 0.05  # the client gives up mid-request
                    try:
                        r = await http.post(path, content=body, headers=headers, timeout=0.05 if hang_up else 60)
                    except httpx.TimeoutException:
                        statuses["hung up" if hang_up else "timeout"] += 1
                        continue
                    except httpx.HTTPError as exc:
                        statuses[f"no answer ({type(exc).__name__})"] += 1
                        unexpected.append(f"{path} {body[:80]!r}: {type(exc).__name__}")
                        continue
                    statuses[str(r.status_code)] += 1
                    if r.status_code >= 500 and r.status_code not in (503, 504):
                        unexpected.append(f"{path} {body[:80]!r}: {r.status_code} {r.text[:200]}")

        async def fill_pools() -> None:
            """The replica's bounded pools to their configured size, as the heaviest traffic would take
            them: 64 texts x beam 4 (every decode slot), each decoded to the length cap, with long
            sources of words and of the fuzz's odd characters (one token a character)."""
            rng = random.Random(-1)
            words = [" ".join(rng.sample(sentences, 6)) for _ in range(64)]
            odd = ["".join(chr(rng.randint(0x100, 0x2FFF)) for _ in range(400)) for _ in range(64)]
            async with httpx.AsyncClient(base_url=server.url, timeout=300) as http:
                for texts in (words, odd):
                    body = {
                        "texts": texts,
                        "source": "en",
                        "target": "de",
                        "beam_size": 4,
                        "min_decoding_length": 255,
                        "split_sentences": False,
                        "cache": False,
                    }
                    r = await http.post("/v1/translate", json=body)
                    print(f"  pools filled: {r.status_code} {r.text[:100]}, rss MiB {rss()}", flush=True)

        async def run() -> tuple[dict[str, float], dict[str, float]]:
            await fill_pools()
            start = time.monotonic()
            tasks = [asyncio.create_task(client(k, start + seconds)) for k in range(3)]
            warm: dict[str, float] = {}
            async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
                while (now := time.monotonic() - start) < seconds:
                    await asyncio.sleep(min(30.0, seconds / 20))
                    mem = rss()
                    if not warm and now >= seconds / 10:
                        warm = mem
                    try:
                        cache = (await http.get("/v1/stats")).json()["en-de"]["gateway"]["cache"]
                        held = f"cache {cache['entries']} entries {cache['bytes'] / 2**20:.1f} MiB"
                    except (httpx.HTTPError, KeyError, ValueError) as exc:
                        held = f"cache unknown ({type(exc).__name__})"
                    print(
                        f"  soak {now:6.0f}/{seconds:.0f} s  rss MiB "
                        + ", ".join(f"{d} {v:.0f}" for d, v in mem.items())
                        + f"  {held}  {dict(statuses)}",
                        flush=True,
                    )
            await asyncio.gather(*tasks)
            return warm, rss()

        warm, end = asyncio.run(run())
        print(f"soak: {sum(statuses.values())} requests, {dict(statuses)}", flush=True)
        for line in unexpected[:10]:
            print(f"  unexpected: {line}", flush=True)
        check(not unexpected, "no 5xx but 503/504, every connection answered", failures)
        for d in procs:
            growth = end[d] / warm[d] - 1
            check(
                growth <= 0.10,
                f"{d}: resident memory {warm[d]:.0f} MiB after warm-up, {end[d]:.0f} MiB at the end ({growth:+.1%})",
                failures,
            )
    finally:
        server.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="spike,replica-kill,gateway-kill,slow-clients,engine-kill,colocated-kill,sigterm")
    p.add_argument("--duration", type=float, default=12.0, help="seconds of load per case")
    p.add_argument("--spike-factor", type=float, default=10.0, help="the spike's rate over the sustainable one")
    p.add_argument("--spike-queue-wait", type=float, default=0.1, help="the spike server's max_queue_wait_s (seconds)")
    p.add_argument("--sigterm-clients", type=int, default=0, help="sigterm under a closed loop of this many clients")
    p.add_argument("--repeat", type=int, default=1, help="run the cases this many times")
    p.add_argument("--out", type=Path, help="also write the run's output as a report here")
    args = p.parse_args()
    with recorded("# Fault and overload suite", args.out):
        return run(args)


def run(args: argparse.Namespace) -> int:
    """The cases asked for, in order; 1 when a check failed."""
    # SIGTERM (a CI timeout, kill) unwinds like Ctrl-C, so each case's `finally` stops its server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    failures: list[str] = []
    shared: list[Server] = []  # the server of the cases that leave it serving
    cases = args.cases.split(",") * args.repeat
    unknown = set(cases) - set(CASES)
    if unknown:
        raise SystemExit(f"unknown case {sorted(unknown)[0]!r}")
    # The kills of a split server's replicas need the model in a deployment of its own; without them the
    # shared server has the default layout, and the colocated kill ends it, last of its cases.
    split = bool({"replica-kill", "gateway-kill"} & set(cases))
    on_shared = {*SHARED_ORDER, *(() if split else ("colocated-kill",))}

    def server() -> Server:
        if not shared:  # a body timeout short enough for slow-clients, long past every other case's bodies
            shared.append(Server(BEAMSERVE_BODY_TIMEOUT_S="3", **({"BEAMSERVE_COLOCATE": "false"} if split else {})))
        return shared[0]

    try:
        for case in sorted(cases, key=lambda c: SHARED_ORDER.index(c) if c in SHARED_ORDER else 3):  # shared first
            print(f"== {case}", flush=True)
            if case not in on_shared:  # the shared server's cases are done: its CPU is the next case's
                while shared:
                    shared.pop().stop()
            if case == "spike":
                case_spike(args.duration, failures, args.spike_factor, args.spike_queue_wait)
            elif case == "replica-kill":
                case_kill(server(), "model-en-de", args.duration, failures)
            elif case == "gateway-kill" or (case == "colocated-kill" and not split):  # the ingress's replica
                case_kill(server(), "Gateway", args.duration, failures)
            elif case == "colocated-kill":
                colocated = Server()
                try:
                    case_kill(colocated, "Gateway", args.duration, failures)
                finally:
                    colocated.stop()
            elif case == "sigterm":
                case_sigterm(args.duration, failures, args.sigterm_clients)
            elif case == "slow-clients":
                case_slow_clients(server(), args.duration, failures)
            elif case == "engine-kill":
                case_kill(server(), "engine", args.duration, failures)
            elif case == "soak":
                case_soak(args.duration, failures)
    finally:
        for s in shared:
            s.stop()
    summarise(failures)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
