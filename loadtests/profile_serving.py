"""Where a gateway replica's CPU goes on the serving path: py-spy samples of the gateway while a
closed loop sends cached one-sentence requests, grouped by the module of each sample's innermost frame.

    python loadtests/profile_serving.py                 # `beamserve serve` behind HAProxy, 10 s of samples
    python loadtests/profile_serving.py --uncached      # every sentence decoded
    python loadtests/profile_serving.py --texts 10      # ten texts a request

py-spy (a dev dependency) reads the replica's memory: it needs ptrace rights over it (root, or
kernel.yama.ptrace_scope 0). Samples where the gateway's threads wait (the event loop's poll, Ray's
core worker, idle thread pools) are left out, and so are those of the engine's thread where the
gateway holds the model (one model: Settings.colocate): its decoding is not the path.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import http_load
from bench_serving import bodies
from harness import Server, test_sentences

# (what a frame's file path holds, the group) in order: the first that matches names the sample.
GROUPS = [
    ("service/request_log", "beamserve: summary line"),
    ("service/metrics", "metrics (beamserve's and Ray's)"),
    ("ray/util/metrics", "metrics (beamserve's and Ray's)"),
    ("ray/serve/metrics", "metrics (beamserve's and Ray's)"),
    ("service/", "beamserve: ingress and route"),
    ("model/", "beamserve: ingress and route"),
    ("limits/", "beamserve: ingress and route"),
    ("fastapi/", "FastAPI and Starlette"),
    ("starlette/", "FastAPI and Starlette"),
    ("uvicorn/", "uvicorn"),
    ("grpc/", "Serve's handle call (router, gRPC)"),
    ("ray/serve/_private/router", "Serve's handle call (router, gRPC)"),
    ("ray/serve/_private/request_router", "Serve's handle call (router, gRPC)"),
    ("ray/serve/handle", "Serve's handle call (router, gRPC)"),
    ("ray/serve/", "Serve's replica (direct ingress)"),
    ("pydantic", "pydantic"),
    ("ray/", "Ray core"),
    ("asyncio", "asyncio"),
    ("logging", "logging"),
]
ENGINE = "Engine._loop ("  # the engine thread's frame (service/engine/engine.py)
IDLE = ("_worker (", "main_loop (", "PythonGCThread", "Condition.wait", "Event.wait")


def group(frame: str) -> str:
    path = frame.split(" (", 1)[1] if " (" in frame else frame
    return next((name for key, name in GROUPS if key in path), "other Python")


def summarise(raw: Path, key: Callable[[str], str] = group) -> list[tuple[str, float]]:
    """Shares of the busy samples by key(innermost frame): its group, or with --top the frame itself."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        # The event loop waiting (uvloop's poll shows as the thread's own frame) or an idle thread.
        if any(m in stack for m in IDLE) or stack.rsplit(";", 1)[-1].startswith("Thread.run ("):
            continue
        if ENGINE in stack:  # a model the gateway holds (Settings.colocate): its decoding is not the path
            continue
        counts[key(stack.rsplit(";", 1)[-1])] += int(n)
    total = sum(counts.values()) or 1
    return [(name, 100 * n / total) for name, n in counts.most_common()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=10, help="seconds of samples")
    ap.add_argument("--uncached", action="store_true", help='"cache": false: every sentence decoded')
    ap.add_argument("--texts", type=int, choices=(1, 10), default=1, help="texts a request")
    ap.add_argument("--top", type=int, default=0, help="also the N functions with the most samples (innermost frames)")
    ap.add_argument("--raw", type=Path, help="also keep py-spy's samples (collapsed stacks) in this file")
    args = ap.parse_args()
    workload = f"{'uncached' if args.uncached else 'cached'}-{args.texts}"
    server = Server("beamserve", "haproxy")
    try:
        gateway = next(
            p.pid
            for p in psutil.Process(server.proc.pid).children(recursive=True)
            if "ServeReplica:beamserve:Gateway" in " ".join(p.cmdline())
        )
        wire = [
            http_load.request_bytes("/v1/translate", b, port=server.port)
            for b in bodies(workload, test_sentences(1000))
        ]
        in_flight = 2 if args.uncached else 16
        done = threading.Event()

        def load() -> None:
            while not done.is_set():
                asyncio.run(http_load.closed_loop(server.port, wire, total=200, concurrency=in_flight))

        threading.Thread(target=load, daemon=True).start()
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "gateway.txt"
            print(f"sampling the gateway (pid {gateway}) for {args.seconds} s under {workload} ...", file=sys.stderr)
            spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"  # the venv's, else PATH's
            # --gil: only the thread holding the GIL is sampled; a thread waiting for it (behind the engine's
            # thread) spends no CPU, and would otherwise be counted at whatever line it waits on.
            cmd = [spy, "record", "--pid", str(gateway), "--duration", str(args.seconds), "--rate", "250", "--gil"]
            subprocess.run([*cmd, "--format", "raw", "--output", str(raw)], check=True, capture_output=True)
            done.set()
            if args.raw:
                shutil.copyfile(raw, args.raw)
            print(f"| group ({workload}, gateway replica) | share of its busy samples |\n|---|---:|")
            for name, share in summarise(raw):
                print(f"| {name} | {share:.1f}% |")
            if args.top:
                print("\n| function (file:line) | group | share |\n|---|---|---:|")
                for frame, share in summarise(raw, key=lambda f: f)[: args.top]:
                    print(f"| `{frame}` | {group(frame)} | {share:.1f}% |")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
