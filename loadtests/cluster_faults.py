"""Cluster fault suite: the production Serve config on a real multi-node Ray cluster (loadtests/cluster.py:
`ray start` nodes with the RayService's environment, `serve deploy` through the dashboard), under load
while something changes or breaks.

    python loadtests/cluster_faults.py                          # every case, one cluster
    python loadtests/cluster_faults.py --cases front,node-kill --duration 12

Cases (in this order on one cluster: a head with no CPUs for replicas, as the RayService's, and two
worker nodes of 3 logical CPUs; the pair en-de, two model and two gateway replicas; traffic to
127.0.0.1 only):
- front: what `beamserve serve` adds holds on the cluster from the pods' environment alone: HAProxy's
  own refusal (a body over the limit) and an unknown route are JSON with the request id; HAProxy's
  stats and exporter listen on loopback; each request has its line in a gateway's requests log.
- user-config: a live change of the batching knobs (`serve deploy` with a new user_config) under load:
  every request answered 200, the model replicas reconfigured in place (same processes), the new
  knobs in /v1/stats.
- rollout: the pair's model replaced by another directory (a registry entry's path) under load (a
  quarter of the sustainable rate, the loading replicas sharing the host's cores): every request
  answered 200, the new model's digest in /v1/models once the rollout is done.
- autoscale: a load ramp past target_ongoing_requests (16 clients, one replica's capacity and more)
  takes the pair from 1 replica to at least 2 (upscale and downscale delays shortened),
  max_replicas_per_node respected, and back to 1 once the load stops; the time to each printed; no
  answer but 200 and JSON 503s (refusals past capacity until the second replica runs).
- node-kill: the worker node holding the most replicas SIGKILLed (its raylet, agents and workers) at
  a third of the load: no answer but 200, 503 and 504 (every 503 JSON with its request id and
  Retry-After), no dropped connection, answering 200 again and the app RUNNING with its replicas
  within RECOVERY_S.
- head-restart: with GCS fault tolerance (the GCS in a Redis server, as the gcs-ft component sets it
  up), every process of the head SIGKILLed and `ray start` run again: the worker nodes' replicas keep
  running (the same processes), answers are 200, a JSON 503 with Retry-After or, while the head's
  front is down, a refused connection (here the front runs on the head), and 200 again within
  RECOVERY_S / 2.

Each case prints counts per status and its recovery times, and fails (exit 1) when a check fails.
The whole run lives in namespaces of its own (cluster.isolate) and ends every process it started.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cluster
from faults import Load, check, json_error, open_loop, recovered_after, report, summarise, throughput
from reports import recorded

RECOVERY_S = 60.0  # a lost node's replicas must be replaced within this
CASES = "front,user-config,rollout,autoscale,node-kill,head-restart"


def sustainable(url: str) -> float:
    """Requests a second the cluster completes (faults.throughput), at least one."""
    return max(1.0, throughput(url))


def models(url: str) -> list[dict[str, Any]]:
    return list(httpx.get(f"{url}/v1/models", timeout=10).json()["models"])


def all_ok(name: str, load: Load, failures: list[str]) -> None:
    bad = Counter(f"{o.status} {error_code(o.body)}".strip() for o in load.outcomes if o.status != 200)
    check(not bad, f"{name}: every request answered 200 ({dict(bad) or 'none else'})", failures)


def error_code(body: str) -> str:
    try:
        return str(json.loads(body).get("error", ""))
    except (ValueError, AttributeError):
        return ""


def json_503s(name: str, load: Load, failures: list[str]) -> None:
    refused = [o for o in load.outcomes if o.status == 503]
    ok = all(json_error(o.body) and o.retry_after for o in refused)
    check(ok, f"{name}: every 503 JSON with Retry-After", failures)


def case_front(c: cluster.Cluster, failures: list[str], headers: dict[str, str] | None = None) -> None:
    """`headers` on every request (an API key where the app has keys)."""
    headers = headers or {}
    big = httpx.post(
        f"{c.url}/v1/translate",
        content=b"x" * 2_000_000,
        headers={"content-type": "application/json", **headers},
        timeout=30,
    )
    check(big.status_code == 413 and json_error(big.text), f"front: HAProxy's 413 is JSON ({big.text[:80]})", failures)
    missing = httpx.get(f"{c.url}/v1/nothing-here", headers=headers, timeout=30)
    check(missing.status_code == 404 and json_error(missing.text), "front: an unknown route is a JSON 404", failures)
    config = haproxy_config()
    binds = [line.split()[1] for line in config.splitlines() if line.strip().startswith("bind ")]
    public = [b for b in binds if not b.startswith("127.0.0.1:") and not b.endswith(f":{cluster.HTTP_PORT}")]
    check(bool(binds) and not public, f"front: HAProxy's other listeners on loopback ({binds})", failures)
    rid = "cluster-front-check"
    ok = httpx.post(
        f"{c.url}/v1/translate",
        json={"texts": ["A man rides a horse."], "source": "en", "target": "de"},
        headers={"x-request-id": rid, **headers},
        timeout=30,
    )
    logs = Path(c.temp_dir)
    deadline = time.monotonic() + 10
    while not (logged := any(rid in p.read_text() for p in logs.glob("session_*/logs/serve/requests_*.log"))):
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    check(ok.status_code == 200 and logged, "front: a request's line in a gateway's requests log", failures)


def haproxy_config() -> str:
    """The configuration the cluster's HAProxy runs (its -f argument)."""
    import psutil

    for p in psutil.process_iter(["name", "cmdline"]):
        if (p.info["name"] or "").startswith("haproxy"):
            args = p.info["cmdline"] or []
            if "-f" in args:
                return Path(args[args.index("-f") + 1]).read_text()
    return ""


def case_user_config(c: cluster.Cluster, config: dict[str, Any], seconds: float, failures: list[str]) -> None:
    rate = sustainable(c.url)
    before = {pid for d, _, pid in c.replicas() if d.startswith("model-")}
    changed = retuned(config, RETUNED)
    done: list[float] = []

    def redeploy() -> None:
        t = time.monotonic()
        c.deploy(changed)
        done.append(time.monotonic() - t)

    load = asyncio.run(open_loop_with(c.url, rate / 2, seconds, seconds / 3, redeploy))
    report("user-config", load, f"; deployed in {done[0]:.1f} s" if done else "")
    all_ok("user-config", load, failures)
    after = {pid for d, _, pid in c.replicas() if d.startswith("model-")}
    check(after == before, "user-config: the model replicas reconfigured in place (same processes)", failures)
    check(knobs_served(c.url, RETUNED), "user-config: the new knobs in /v1/stats", failures)


RETUNED = {"batch_wait_ms": 2.0, "max_waiting_steps": 8}  # user_config knobs a live change sets


def retuned(config: dict[str, Any], knobs: dict[str, Any]) -> dict[str, Any]:
    """The config with `knobs` in each model deployment's user_config."""
    changed = json.loads(json.dumps(config))
    for d in changed["applications"][0]["deployments"]:
        if d["name"].startswith("model-"):
            d["user_config"] |= knobs
    return dict(changed)


def knobs_served(url: str, knobs: dict[str, Any], headers: dict[str, str] | None = None) -> bool:
    """Whether every model replica /v1/stats reaches (six asks) runs with `knobs`."""
    seen = [
        stats["config"]
        for _ in range(6)
        for stats in httpx.get(f"{url}/v1/stats", headers=headers or {}, timeout=10).json().values()
    ]
    return bool(seen) and all(s.get(k) == v for s in seen for k, v in knobs.items())


async def open_loop_with(url: str, rate: float, seconds: float, at: float, action: Any) -> Load:
    """open_loop with `action` run in a thread at `at` s (it blocks: a deploy, a wait)."""
    loop = asyncio.get_running_loop()
    task: list[asyncio.Future[Any]] = []
    load = await open_loop(url, rate, seconds, [(at, lambda: task.append(loop.run_in_executor(None, action)))])
    if task:
        await task[0]
    return load


def registry_config(config: dict[str, Any], path: Path) -> dict[str, Any]:
    out = json.loads(json.dumps(config))
    args = out["applications"][0]["args"]
    args.pop("models", None)
    args["model_registry"] = [{"name": "en-de", "path": str(path), "sources": ["en"], "targets": ["de"]}]
    return dict(out)


def perturbed_copy(src: Path, dest: Path) -> Path:
    """A copy of a model directory whose weights differ in one value's last bits: another digest, a
    model that translates the same."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dest)
    weights = load_file(str(dest / "model.safetensors"))
    name = next(k for k, v in weights.items() if v.is_floating_point() and v.dim() == 2)
    bits = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}
    weights[name].view(bits[weights[name].dtype]).view(-1)[0] ^= 1  # one value's last bit
    save_file(weights, str(dest / "model.safetensors"))
    return dest


def case_rollout(c: cluster.Cluster, config: dict[str, Any], seconds: float, failures: list[str]) -> dict[str, Any]:
    shipped = cluster.REPO / "model" / "pretrained" / "en-de"
    work = Path(tempfile.mkdtemp(prefix="models-", dir=c.temp_dir))
    first = registry_config(config, perturbed_copy(shipped, work / "v1"))
    second = registry_config(config, perturbed_copy(work / "v1", work / "v2"))
    c.deploy(first)
    old = {m["digest"] for m in models(c.url)}
    rate = sustainable(c.url)
    done: list[float] = []

    def roll() -> None:
        t = time.monotonic()
        c.deploy(second)
        done.append(time.monotonic() - t)

    # A quarter of the rate: the new replicas load on the cores the old ones decode on (the nodes' 6
    # logical CPUs are this host's 2), and at half of it a few requests were refused as overloaded.
    load = asyncio.run(open_loop_with(c.url, rate / 4, max(seconds, 20.0), seconds / 3, roll))
    report("rollout", load, f"; rolled out in {done[0]:.1f} s" if done else "")
    all_ok("rollout", load, failures)
    new = {m["digest"] for _ in range(6) for m in models(c.url)}
    check(len(new) == 1 and not new & old, f"rollout: only the new digest in /v1/models ({new} after {old})", failures)
    return second


def case_autoscale(c: cluster.Cluster, config: dict[str, Any], failures: list[str]) -> None:
    scaled = cluster.serve_config(
        model_replicas=1,
        autoscaling={"target_ongoing_requests": 4, "upscale_delay_s": 2, "downscale_delay_s": 5, "max_replicas": 2},
    )
    scaled["applications"][0]["args"] = config["applications"][0]["args"]
    c.deploy(scaled)
    pair = next(d["name"] for d in scaled["applications"][0]["deployments"] if d["name"].startswith("model-"))

    def count() -> list[str]:
        return [node for d, node, _ in c.replicas() if d == pair]

    deadline = time.monotonic() + RECOVERY_S
    while len(count()) != 1 and time.monotonic() < deadline:  # a replica past min_replicas stopping
        time.sleep(0.5)
    check(len(count()) == 1, f"autoscale: {pair} starts at 1 replica ({len(count())})", failures)
    stop = [False]
    up: list[float] = []

    async def ramp() -> Load:
        from faults import one

        load, start = Load(), time.monotonic()

        async def client(k: int) -> None:
            i = k
            while not stop[0] and time.monotonic() - start < RECOVERY_S:
                await one(int(c.url.rsplit(":", 1)[1]), i, start, load)
                i += 16

        async def watch() -> None:
            while time.monotonic() - start < RECOVERY_S and not up:
                if len(count()) >= 2:
                    up.append(time.monotonic() - start)
                await asyncio.sleep(0.5)
            await asyncio.sleep(3)  # the new replica takes load before the ramp ends
            stop[0] = True

        await asyncio.gather(watch(), *(client(k) for k in range(16)))
        return load

    load = asyncio.run(ramp())
    nodes = Counter(count())
    t, down = time.monotonic(), None
    while time.monotonic() - t < RECOVERY_S:
        if len(count()) == 1:
            down = time.monotonic() - t
            break
        time.sleep(0.5)
    extra = f"; 2 replicas {up[0]:.1f} s into the ramp" if up else ""
    report("autoscale", load, extra + (f", back to 1 {down:.1f} s after it" if down is not None else ""))
    # The ramp is past one replica's capacity until the second one runs: refusals are its answer then.
    bad = [o for o in load.outcomes if o.status not in (200, 503)]
    check(not bad, f"autoscale: no answer but 200 and 503, no dropped connection ({len(bad)})", failures)
    json_503s("autoscale", load, failures)
    check(bool(up), f"autoscale: {pair} scaled to 2 replicas within {RECOVERY_S:.0f} s", failures)
    limit = next(d for d in scaled["applications"][0]["deployments"] if d["name"] == pair)["max_replicas_per_node"]
    check(max(nodes.values(), default=0) <= limit, f"autoscale: at most {limit} replicas a node ({nodes})", failures)
    check(down is not None, f"autoscale: back to 1 replica within {RECOVERY_S:.0f} s of the load's end", failures)


def case_node_kill(c: cluster.Cluster, config: dict[str, Any], seconds: float, failures: list[str]) -> None:
    c.deploy(config)
    rate = sustainable(c.url)
    replicas = c.replicas()
    want = Counter(d for d, _, _ in replicas)
    victim = Counter(node for _, node, _ in replicas if node != "head").most_common(1)[0][0]
    lost = sorted(d for d, node, _ in replicas if node == victim)
    at = seconds / 3
    killed: list[float] = []

    def kill() -> None:
        killed.append(time.monotonic())
        c.kill_node(victim)

    load = asyncio.run(open_loop(c.url, rate / 2, seconds, [(at, kill)]))
    back = None
    while time.monotonic() - killed[0] < RECOVERY_S:
        running = Counter(d for d, _, _ in c.replicas())
        if all(running[d] >= n for d, n in want.items()) and app_running(c):
            back = time.monotonic() - killed[0]
            break
        time.sleep(0.5)
    answering = recovered_after(load, at)
    name = f"node-kill ({victim}: {', '.join(lost)})"
    extra = f"; answering 200 {answering:.1f} s after the kill" if answering is not None else ""
    report(name, load, extra + (f"; replicas replaced {back:.1f} s after it" if back is not None else ""))
    bad = [o for o in load.outcomes if o.status not in (200, 503, 504)]
    check(not bad, f"node-kill: no answer but 200/503/504, no dropped connection ({len(bad)})", failures)
    json_503s("node-kill", load, failures)
    check(back is not None, f"node-kill: the lost replicas replaced within {RECOVERY_S:.0f} s", failures)


def case_head_restart(c: cluster.Cluster, failures: list[str]) -> None:
    rate = sustainable(c.url)
    before = {pid for _, node, pid in c.replicas() if node != "head"}
    at = 4.0
    took: list[float] = []

    def restart() -> None:
        took.append(c.restart_head())

    load = asyncio.run(open_loop_with(c.url, rate / 2, at + RECOVERY_S / 2, at, restart))
    back = recovered_after(load, at)
    gap = [o for o in load.outcomes if o.sent > at and o.status != 200]
    last_bad = max((o.sent for o in gap), default=at) - at
    extra = f"; the head's `ray start` {took[0]:.1f} s" if took else ""
    if back is not None:
        extra += f", answering 200 {back:.1f} s after the kill, the last failure {last_bad:.1f} s after it"
    report("head-restart", load, extra)
    for o in gap:
        if o.status:
            print(f"  e.g. {o.status} at {o.sent - at:.1f} s: {o.body[:200]}")
            break
    check(back is not None, f"head-restart: answering 200 again within {RECOVERY_S / 2:.0f} s", failures)
    after = {pid for _, node, pid in c.replicas() if node != "head"}
    check(before <= after, "head-restart: the worker nodes' replicas kept running (the same processes)", failures)
    bad = [o for o in load.outcomes if o.status not in (0, 200, 503, 504)]
    check(not bad, f"head-restart: no answer but 200/503/504 ({Counter(o.status for o in bad)})", failures)
    json_503s("head-restart", load, failures)
    later = [o for o in load.outcomes if back is not None and o.sent > at + back + 2 and o.status != 200]
    check(not later, f"head-restart: every request 2 s past the first 200 answered 200 ({len(later)})", failures)


def app_running(c: cluster.Cluster) -> bool:
    try:
        return bool(c.serve_status()["applications"]["beamserve"]["status"] == "RUNNING")
    except (httpx.HTTPError, KeyError, ValueError):
        return False


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=CASES)
    p.add_argument("--duration", type=float, default=12.0, help="seconds of load per case")
    p.add_argument("--out", type=Path, help="also write the run's output as a report here")
    args = p.parse_args()
    cluster.isolate()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with recorded("# Cluster fault suite", args.out):
        failed = run(args)
    return 1 if failed else 0


def run(args: argparse.Namespace) -> bool:
    """Every case asked for on one cluster; True when a check failed."""
    failures: list[str] = []
    config = cluster.serve_config()
    start = time.monotonic()
    with cluster.Cluster(workers=2, worker_cpus=3, gcs_store="head-restart" in args.cases) as c:
        c.deploy(config)
        print(f"cluster of {len(c.nodes)} nodes running the app in {time.monotonic() - start:.1f} s", flush=True)
        for case in args.cases.split(","):
            print(f"== {case}", flush=True)
            if case == "front":
                case_front(c, failures)
            elif case == "user-config":
                case_user_config(c, config, args.duration, failures)
            elif case == "rollout":
                config = case_rollout(c, config, args.duration, failures)
            elif case == "autoscale":
                case_autoscale(c, config, failures)
            elif case == "node-kill":
                case_node_kill(c, config, args.duration, failures)
            elif case == "head-restart":
                case_head_restart(c, failures)
            else:
                raise SystemExit(f"unknown case {case!r}")
    summarise(failures)
    return bool(failures)


if __name__ == "__main__":
    raise SystemExit(main())
