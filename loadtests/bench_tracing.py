"""What tracing costs a served request: CPU per request of beamserve with tracing off (the default), of the
same with every request traced (exported over OTLP/HTTP to a receiver on loopback, loadtests/otlp_receiver.py),
and of beamserve at `--baseline`, a commit without the tracing code, side by side on the same cores, taking
turns workload by workload, round by round.

    python loadtests/bench_tracing.py --baseline f9dcd7a --out loadtests/results/tracing.md

CPU per request as bench_serving.py measures it: every process of a server's tree, less its idle rate,
over the requests answered (the load generator on the same cores, not counted). Workloads: cached-1 (one
sentence the gateway's cache holds: the path alone) and uncached-1 (one sentence decoded, with every span
of its trace), each `--rounds` times. A ratio is the median over rounds of the server's CPU per request
over the baseline's in the same round. The baseline runs from a copy of its commit's files (git archive),
first on every process's path, with this checkout's C kernels where the two commits' kernel sources are
the same (else it stops); it is checked to run its own code: given an OTLP endpoint, it answers no
`traceresponse`.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import Row, measure
from harness import REPO, Server, test_sentences
from otlp_receiver import Receiver
from reports import emit, provenance

WORKLOADS = ("cached-1", "uncached-1")
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def baseline_checkout(rev: str, into: Path) -> Path:
    """The files of commit `rev` under `into`, with this checkout's built C kernels (same sources only)."""
    kernels = ["model/kernels/csrc", "setup.py"]
    if subprocess.run(["git", "diff", "--quiet", rev, "--", *kernels], cwd=REPO).returncode != 0:
        raise SystemExit(f"the C kernels' sources differ between {rev} and this checkout: build them there")
    archive = subprocess.run(["git", "archive", rev], cwd=REPO, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    for built in (REPO / "model" / "kernels").glob("_native*.so"):
        shutil.copy2(built, into / "model" / "kernels" / built.name)
    return into


def answers_a_trace(server: Server) -> bool:
    r = httpx.post(
        f"{server.url}/v1/translate",
        json={"texts": ["A dog runs."], "source": "en", "target": "de"},
        headers={"traceparent": TRACEPARENT},
        timeout=60,
    )
    r.raise_for_status()
    return "traceresponse" in r.headers


def report(rows: list[Row], args: argparse.Namespace, spans: int, traces: int) -> str:
    def cell(server: str, workload: str) -> tuple[list[Row], float]:
        mine = sorted((r for r in rows if (r.server, r.workload) == (server, workload)), key=lambda r: r.round)
        return mine, sorted(r.cpu_ms for r in mine)[len(mine) // 2]

    lines = [
        "# Tracing's cost on the serving path",
        "",
        f"{provenance()} The load generator on the same cores.",
        f"{args.requests} requests a workload and round ({args.requests // 5} uncached), {args.concurrency} in"
        f" flight (2 uncached), after a warm-up; the servers taking turns, {args.rounds} rounds.",
        "",
        "| workload | server | requests/s (median round) | CPU ms / request (median round) |"
        " / baseline, same round (median) |",
        "|---|---|---:|---:|---:|",
    ]
    for workload in WORKLOADS:
        base, _ = cell("baseline", workload)
        by_round = {r.round: r.cpu_ms for r in base}
        for server in ("baseline", "off", "traced"):
            mine, cpu = cell(server, workload)
            ratios = sorted(r.cpu_ms / by_round[r.round] for r in mine if r.round in by_round)
            rate = sorted(r.ok / r.seconds for r in mine)[len(mine) // 2]
            lines.append(f"| {workload} | {server} | {rate:.0f} | {cpu:.2f} | {ratios[len(ratios) // 2]:.3f}x |")
    lines += [
        "",
        f"baseline: beamserve at {args.baseline}, without the tracing code. off: this commit, no endpoint (the"
        " default). traced: this commit with `otlp_endpoint` set and `trace_ratio` 1, every request traced",
        f"to the receiver, which got {spans} spans of {traces} traces over the run.",
        "Each round's CPU per request, for the spread between rounds:",
        "",
        "| workload | server | each round's CPU ms / request |",
        "|---|---|---|",
    ]
    for workload in WORKLOADS:
        for server in ("baseline", "off", "traced"):
            mine, _ = cell(server, workload)
            lines.append(f"| {workload} | {server} | {', '.join(f'{r.cpu_ms:.2f}' for r in mine)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", required=True, help="a commit without the tracing code")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=1000, help="cached requests a round (a fifth uncached)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--out", type=Path, default=None, help="also write the report here")
    args = ap.parse_args()
    sentences = test_sentences(1000)
    receiver = Receiver().start()
    servers: dict[str, Server] = {}
    with tempfile.TemporaryDirectory(prefix="beamserve-baseline-") as tmp:
        try:
            checkout = baseline_checkout(args.baseline, Path(tmp))
            print("starting the three servers", file=sys.stderr, flush=True)
            servers["baseline"] = Server(settings={"BEAMSERVE_OTLP_ENDPOINT": receiver.url}, checkout=checkout)
            if answers_a_trace(servers["baseline"]):
                raise SystemExit(f"the baseline server runs this checkout's code, not {args.baseline}'s")
            servers["off"] = Server()
            traced = {"BEAMSERVE_OTLP_ENDPOINT": receiver.url, "BEAMSERVE_TRACE_RATIO": "1"}
            servers["traced"] = Server(settings=traced)
            assert answers_a_trace(servers["traced"]) and not answers_a_trace(servers["off"])
            rows: list[Row] = []
            for r in range(args.rounds):
                for workload in WORKLOADS:
                    for name, server in servers.items():
                        row = measure(server, workload, sentences, args.requests, args.concurrency)
                        row.server, row.round = name, r
                        rows.append(row)
                        print(
                            f"  round {r + 1}/{args.rounds} {workload} {name}: {row.ok / row.seconds:.0f}/s,"
                            f" {row.cpu_ms:.2f} CPU ms a request",
                            file=sys.stderr,
                            flush=True,
                        )
        finally:
            for server in servers.values():
                server.stop()
    traces = len({s.trace_id for s in receiver.spans})
    receiver.stop()
    emit(report(rows, args, len(receiver.spans), traces), args.out)


if __name__ == "__main__":
    main()
