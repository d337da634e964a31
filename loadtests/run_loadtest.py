"""`make loadtest`: step load with locust against 127.0.0.1: continuous batching (the default),
request-level batching and no batching, side by side.

For each mode it starts `beamserve serve` (unless --external and a server already answers), runs
locust headless with the step shape for a bounded time, stops what it started, and writes the CSVs,
locust's HTML report, a PNG plot (throughput and p50/p95 latency against users) and a markdown
summary with the SLO verdict into --out.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import httpx
from harness import Server
from reports import emit

REPO = Path(__file__).resolve().parents[1]
MODES = {
    "batching": {},  # the default: continuous batching
    "request-batching": {"BEAMSERVE_MODE": "request"},
    "no-batching": {"BEAMSERVE_MODE": "none"},
}


def ready(url: str) -> bool:
    """Every pair ready: /readyz is 200 once any pair answers, and the traffic asks for all of them."""
    try:
        r = httpx.get(f"{url}/readyz", timeout=2)
        return r.status_code == 200 and all(state == "ready" for state in r.json()["pairs"].values())
    except (httpx.HTTPError, ValueError, KeyError):
        return False


def run_locust(url: str, prefix: Path, args: argparse.Namespace) -> int:
    env = {
        **os.environ,
        "BEAMSERVE_STEP_LOAD": "1",
        "BEAMSERVE_STEP_USERS": str(args.step_users),
        "BEAMSERVE_STEP_SECONDS": str(args.step_seconds),
        "BEAMSERVE_MAX_USERS": str(args.max_users),
        "BEAMSERVE_SLO_P95_MS": str(args.slo_p95_ms),
    }
    limit = int(args.max_users / args.step_users * args.step_seconds) + 5
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(REPO / "loadtests" / "locustfile.py"),
        "--headless",
        "--host",
        url,
        "--csv",
        str(prefix),
        "--csv-full-history",
        "--html",
        f"{prefix}.html",
        "--run-time",
        f"{limit}s",
        "--stop-timeout",
        "10",
        "--only-summary",
    ]
    print(
        f"locust: up to {args.max_users} users, +{args.step_users} every {args.step_seconds:.0f}s "
        f"(at most {limit}s) against {url}",
        flush=True,
    )
    return subprocess.run(cmd, cwd=REPO, env=env, timeout=limit + 120).returncode


def steps(prefix: Path) -> list[dict[str, float]]:
    """Per user count: mean throughput, the last p50/p95 and the failure ratio of that step."""
    with open(f"{prefix}_stats_history.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["Name"] == "Aggregated"]
    by_users: dict[int, list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        if int(r["User Count"]) > 0 and r["95%"] not in ("N/A", ""):
            by_users[int(r["User Count"])].append(r)
    out = []
    for users, rs in sorted(by_users.items()):
        rps = [float(r["Requests/s"]) for r in rs]
        fails = [float(r["Failures/s"]) for r in rs]
        out.append(
            {
                "users": users,
                "rps": sum(rps) / len(rps),
                "p50": float(rs[-1]["50%"]),
                "p95": float(rs[-1]["95%"]),
                "fail": sum(fails) / max(sum(rps), 1e-9),
            }
        )
    return out


def plot(results: dict[str, list[dict[str, float]]], path: Path, slo: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (mode, rows) in enumerate(results.items()):
        users, color = [r["users"] for r in rows], f"C{i}"  # one colour per mode: p50 dashed, p95 solid
        ax1.plot(users, [r["rps"] for r in rows], marker="o", color=color, label=mode)
        ax2.plot(users, [r["p50"] for r in rows], marker="o", color=color, linestyle="--", label=f"{mode} p50")
        ax2.plot(users, [r["p95"] for r in rows], marker="o", color=color, label=f"{mode} p95")
    ax2.axhline(slo, color="red", linewidth=0.8, label=f"SLO p95 {slo:.0f} ms")
    ax1.set(xlabel="users", ylabel="requests/s", title="Throughput")
    ax2.set(xlabel="users", ylabel="ms", title="Latency", yscale="log")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def summary(results: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> str:
    lines = [
        "# Load test",
        "",
        f"SLO: p95 <= {args.slo_p95_ms:.0f} ms and failures <= 1%. Traffic: loadtests/locustfile.py "
        "(test_2016_flickr sentences, 1 or 2-8 per request, beam 1/4/5, en-de and en-fr, LibreTranslate "
        "route too).",
        "",
        "![throughput and latency](loadtest.png)",
        "",
    ]
    best: dict[str, float] = {}
    for mode, rows in results.items():
        lines += [
            f"## {mode}",
            "",
            "| users | req/s | p50 ms | p95 ms | failures | within SLO |",
            "|---|---|---|---|---|---|",
        ]
        for r in rows:
            ok = r["p95"] <= args.slo_p95_ms and r["fail"] <= 0.01
            if ok:
                best[mode] = max(best.get(mode, 0.0), r["rps"])
            lines.append(
                f"| {r['users']} | {r['rps']:.1f} | {r['p50']:.0f} | {r['p95']:.0f} | {r['fail']:.1%} | "
                f"{'yes' if ok else 'no'} |"
            )
        lines.append("")
    lines.append("## Verdict")
    lines.append("")
    for mode in results:
        lines.append(f"- {mode}: sustainable throughput {best.get(mode, 0.0):.1f} req/s within the SLO")
    for base in ("request-batching", "no-batching"):
        if "batching" in best and best.get(base):
            lines.append(f"- batching (continuous) / {base}: {best['batching'] / best[base]:.2f}x")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / "loadtests" / "results")
    p.add_argument("--modes", default="batching,request-batching,no-batching")
    p.add_argument("--step-users", type=int, default=4)
    p.add_argument("--step-seconds", type=float, default=15)
    p.add_argument("--max-users", type=int, default=32)
    p.add_argument("--slo-p95-ms", type=float, default=1000)
    p.add_argument("--external", default=None, help="use this running server (one mode) instead of starting one")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict[str, float]]] = {}
    external = args.external if args.external and ready(args.external) else None
    for mode in ["running server"] if external else args.modes.split(","):
        server = None
        if external:
            url = external
            print(f"using the server already running at {url}", flush=True)
        else:
            print(f"[{mode}] starting beamserve on 127.0.0.1 ...", flush=True)
            server = Server(settings={"BEAMSERVE_MODELS": "en-de,en-fr", **MODES[mode]}, every_pair=True)
            url = server.url
        try:
            run_locust(url, args.out / mode.replace(" ", "-"), args)
        finally:
            if server is not None:
                server.stop()
        results[mode] = steps(args.out / mode.replace(" ", "-"))
    plot(results, args.out / "loadtest.png", args.slo_p95_ms)
    emit(summary(results, args), args.out / "SUMMARY.md")


if __name__ == "__main__":
    main()
