"""Batching benchmark: open-loop Poisson load against one model engine configured three ways.

    python loadtests/bench_batching.py --out runs/bench/batching.md

Each request is one test_2016_flickr sentence (drawn at random, so lengths follow that set) decoded
with beam 4. Arrivals are Poisson at a fixed rate for --duration seconds, open loop: a request's
latency counts from its scheduled arrival, so a slow server cannot slow the load down. The same
seeded arrivals go to each configuration of the same engine (service/engine/engine.py, the code a Serve
replica runs, driven in-process so the 2-core machine measures batching rather than HTTP; one
engine, reconfigured between probes as `reconfigure` does for a live replica):

- none: one sentence at a time (mode "none");
- request: request-level dynamic batching (mode "request", batch_wait_ms, max_batch_size 64);
- continuous: continuous batching (mode "continuous": sentences join and leave every decoder step);

A configuration may override BatchingConfig fields: `--configs continuous,continuous/max_waiting_steps=2`.
Sizes not overridden are the device's, as a replica takes them (service/batching.py `sized_for`);
`--sizes-for cpu` gives a GPU run the CPU's sizes to compare.

Rates rise until a configuration's median p95 over --repeats runs misses the target or a request
fails; then its highest passing rate is refined by bisection. At each rate the configurations take
turns within every repetition (this machine is shared and its speed drifts). The report gives
throughput and p50/p95/p99 per rate and each configuration's highest sustained rate.

Before each rate the same engine's capacity is measured, with nothing waiting on arrivals: a burst of
--capacity-sentences requests (drawn as above) all submitted at once, in request mode with the burst
sorted by length (every batch of similar lengths: the most sentences per second this engine decodes),
and in request and continuous mode in the order drawn. A queue kept full is as large as batches get,
so no configuration completes more sentences per second under Poisson arrivals than in a burst; the
report sets the continuous-batching rate against the bursts.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gzip
import json
import math
import os
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness import quantile  # noqa: E402
from reports import emit, provenance  # noqa: E402

from model import DecodeOptions, Translator  # noqa: E402
from service.batching import BatchingConfig, sized_for  # noqa: E402
from service.engine.engine import Engine  # noqa: E402
from service.engine.scheduler import DeadlineExceededError, QueueFullError  # noqa: E402

DATA = Path(os.environ.get("BEAMSERVE_DATA", REPO.parent / "shared" / "data" / "multi30k"))
MODES = ("none", "request", "continuous")  # one at a time, request-level batching, continuous batching

OTHER_TARGETS = [0.5, 0.75]
RATES = [4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 80, 96, 112, 128, 160, 192, 256, 320, 384, 512, 640, 768, 1024]


def batching_config(name: str, device_type: str = "cpu") -> BatchingConfig:
    """A configuration by name, with optional overrides: "continuous/max_waiting_steps=2/decode_slots=512".

    Sizes not given are the device's (a GPU's bigger batches), as a replica running there takes them.
    """
    base, *overrides = name.split("/")
    if base not in MODES:
        raise SystemExit(f"unknown configuration {base!r}; one of {sorted(MODES)}")
    fields = {f.name: f.type for f in dataclasses.fields(BatchingConfig)}
    changes: dict[str, object] = {"mode": base}
    for item in overrides:
        key, _, value = item.partition("=")
        if key not in fields or key == "mode":
            raise SystemExit(f"unknown batching setting {key!r} in {name!r}")
        changes[key] = float(value) if "float" in str(fields[key]) else int(value)
    return sized_for(device_type, changes)


@dataclass
class Probe:
    config: str
    rate: float  # offered requests per second
    sent: int
    ok: int
    failed: int  # 503 (queue full) or 504 (deadline)
    throughput: float  # completed requests per second, first arrival to last completion
    p50: float
    p95: float
    p99: float
    repeat: int = 0  # which repetition (each uses its own seeded arrivals, the same for every configuration)

    def passes(self, target: float) -> bool:
        return self.failed == 0 and self.p95 <= target


@dataclass
class Capacity:
    """A burst decoded with nothing waiting on arrivals: how many sentences a second the engine can do."""

    kind: str  # sorted (request mode, the burst sorted by length), request or continuous (order drawn)
    sentences: int
    seconds: float  # first submission to last completion
    rate: float  # the rate step it was measured before

    @property
    def throughput(self) -> float:
        return self.sentences / self.seconds


CAPACITY_KINDS = ("sorted", "request", "continuous")


def capacity_probe(
    engine: Engine, kind: str, sources: list[list[int]], args: argparse.Namespace, rate: float
) -> Capacity:
    """Decode a seeded burst of one-sentence requests in `kind`'s mode, all submitted at once."""
    config = batching_config("continuous" if kind == "continuous" else "request", sizes_device(args))
    # The burst measures the decoder, not admission: no bound on the estimated wait.
    config = dataclasses.replace(config, max_queue_wait_s=math.inf)
    n = min(args.capacity_sentences, config.max_queue)
    burst = random.Random(args.seed).choices(sources, k=n)
    if kind == "sorted":
        burst.sort(key=len)
    engine.reconfigure(config)
    opts = DecodeOptions(beam_size=args.beam_size)

    async def run() -> float:
        start = time.perf_counter()
        await asyncio.gather(*(engine.translate([ids], opts, timeout_s=600.0) for ids in burst))
        return time.perf_counter() - start

    return Capacity(kind, n, asyncio.run(run()), rate)


def median_probe(runs: list[Probe]) -> Probe:
    """One rate's repetitions as one row: median latencies and throughput, failures summed."""

    def mid(values: list[float]) -> float:
        return statistics.median(values)

    return Probe(
        runs[0].config,
        runs[0].rate,
        sum(p.sent for p in runs),
        sum(p.ok for p in runs),
        sum(p.failed for p in runs),
        mid([p.throughput for p in runs]),
        mid([p.p50 for p in runs]),
        mid([p.p95 for p in runs]),
        mid([p.p99 for p in runs]),
        len(runs),
    )


async def probe(
    engine: Engine,
    name: str,
    rate: float,
    sources: list[list[int]],
    args: argparse.Namespace,
    repeat: int,
) -> Probe:
    rng = random.Random(args.seed + repeat)  # the same arrivals and sentences for every configuration
    arrivals: list[tuple[float, list[int]]] = []
    t = rng.expovariate(rate)
    while t < args.duration:
        arrivals.append((t, rng.choice(sources)))
        t += rng.expovariate(rate)
    opts = DecodeOptions(beam_size=args.beam_size)
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def one(at: float, ids: list[int]) -> tuple[float, bool, float]:
        await asyncio.sleep(max(0.0, start + at - loop.time()))
        try:
            await engine.translate([ids], opts, timeout_s=args.timeout)
            ok = True
        except (QueueFullError, DeadlineExceededError):
            ok = False
        end = loop.time()
        return end - (start + at), ok, end

    results = await asyncio.gather(*(one(at, ids) for at, ids in arrivals))
    latencies = [lat for lat, ok, _ in results if ok]
    last = max((end for _, ok, end in results if ok), default=start + args.duration)
    return Probe(
        name,
        rate,
        len(results),
        len(latencies),
        len(results) - len(latencies),
        len(latencies) / max(last - start, 1e-9),
        quantile(latencies, 0.50),
        quantile(latencies, 0.95),
        quantile(latencies, 0.99),
        repeat,
    )


def sweep(
    tr: Translator,
    names: list[str],
    sources: list[list[int]],
    args: argparse.Namespace,
) -> tuple[list[Probe], list[Capacity]]:
    """Rising rates until a configuration's median p95 misses the target (or a request fails), then
    bisection between its last pass and that miss. At each rate the configurations take turns within
    every repetition, so a slow spell of this shared machine hits them alike; the engine's capacity is
    measured before each rate (--capacity-sentences 0: never). Returns every run and capacity burst."""
    # One engine, reconfigured between probes (it is idle then), not one per configuration: each engine
    # decodes on its own thread, and several threads running the model slow all of them down
    # (OpenMP thread teams, see Translator.load and bench_threads.py).
    configs = {name: batching_config(name, sizes_device(args)) for name in names}
    engine = Engine(
        tr,
        configs[names[0]],
        max_length=256,
        static_slots=args.static_slots or args.compiled_step,
        compiled_step=args.compiled_step,
    )
    runs: list[Probe] = []
    capacities: list[Capacity] = []

    def measure(rates: dict[str, float]) -> dict[str, Probe]:
        for kind in CAPACITY_KINDS if args.capacity_sentences else ():
            c = capacity_probe(engine, kind, sources, args, max(rates.values()))
            capacities.append(c)
            print(
                f"  capacity {kind:10s}: {c.throughput:6.1f} sentences/s ({c.sentences} in {c.seconds:.2f} s)",
                file=sys.stderr,
                flush=True,
            )
        for repeat in range(args.repeats):
            for name, rate in rates.items():
                engine.reconfigure(configs[name])
                p = asyncio.run(probe(engine, name, rate, sources, args, repeat))
                runs.append(p)
                print(
                    f"  {name:10s} {rate:6.1f} req/s #{repeat}: {p.throughput:6.1f} done/s  p50 {p.p50:6.3f}s  "
                    f"p95 {p.p95:6.3f}s  p99 {p.p99:6.3f}s  failed {p.failed:4d}",
                    file=sys.stderr,
                    flush=True,
                )
        return {
            name: median_probe([p for p in runs if p.config == name and p.rate == rate]) for name, rate in rates.items()
        }

    try:
        for name in names:  # warm-up
            engine.reconfigure(configs[name])
            asyncio.run(engine.translate(sources[:8], DecodeOptions(beam_size=args.beam_size), 60))
        for kind in CAPACITY_KINDS if args.capacity_sentences else ():  # first bursts meet new shapes: not counted
            capacity_probe(engine, kind, sources, args, 0.0)
        low = dict.fromkeys(names, 0.0)
        high = dict.fromkeys(names, math.inf)
        for rate in args.rates:
            alive = [n for n in names if not math.isfinite(high[n])]
            if not alive:
                break
            for name, cell in measure(dict.fromkeys(alive, rate)).items():
                if cell.passes(args.p95_target):
                    low[name] = rate
                else:
                    high[name] = rate
        for _ in range(args.bisect):
            mids = {n: round((low[n] + high[n]) / 2, 1) for n in names if math.isfinite(high[n]) and low[n] > 0}
            for name, cell in measure(mids).items():
                if cell.passes(args.p95_target):
                    low[name] = mids[name]
                else:
                    high[name] = mids[name]
        return runs, capacities
    finally:
        engine.close()


def cells(runs: list[Probe]) -> dict[str, list[Probe]]:
    """Per configuration, one median row per rate, by rate."""
    out: dict[str, list[Probe]] = {}
    for name in dict.fromkeys(p.config for p in runs):
        rates = sorted({p.rate for p in runs if p.config == name})
        out[name] = [median_probe([p for p in runs if p.config == name and p.rate == r]) for r in rates]
    return out


def device_text(args: argparse.Namespace) -> str:
    path = "; continuous mode on the static decode state" if getattr(args, "static_slots", False) else ""
    if getattr(args, "compiled_step", False):
        path = "; continuous mode on the static decode state, its step compiled by inductor"
    if args.device == "cpu":
        return f"CPU, {args.threads} threads{path}"
    import torch

    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "GPU"
    return f"{args.device} ({name}, {args.threads} CPU threads){path}"


def sizes_device(args: argparse.Namespace) -> str:
    """The device type whose batch sizes the configurations take where they give none."""
    return str(args.sizes_for or args.device.split(":")[0])


def sizes_text(name: str, args: argparse.Namespace) -> str:
    c = batching_config(name, sizes_device(args))
    return (
        f"{c.decode_slots} decode slots, {c.max_batch_size} sentences, {c.max_batch_tokens} tokens, "
        f"{c.max_queue} queued"
    )


def capacity_lines(capacities: list[Capacity]) -> list[str]:
    """The capacity table: each burst's median, lowest and highest throughput."""
    if not capacities:
        return []
    lines = [
        "",
        "## Capacity: the same engine with nothing waiting on arrivals",
        "",
        f"A burst of {capacities[0].sentences} one-sentence requests submitted at once, measured before every "
        f"rate ({len(capacities) // len(CAPACITY_KINDS)} times); sentences per second, first submission to "
        "last completion:",
        "",
        "| burst | median | lowest | highest |",
        "|---|---:|---:|---:|",
    ]
    for kind in CAPACITY_KINDS:
        values = [c.throughput for c in capacities if c.kind == kind]
        if not values:
            continue
        label = {
            "sorted": "request mode, sorted by length",
            "request": "request mode, order drawn",
            "continuous": "continuous mode, order drawn",
        }[kind]
        lines.append(f"| {label} | {statistics.median(values):.1f} | {min(values):.1f} | {max(values):.1f} |")
    lines += [
        "",
        "A queue kept full is as large as batches get, so no configuration completes more sentences a "
        "second under Poisson arrivals than its bursts do; offered more, its queue, and p95 with it, "
        "grows without bound.",
    ]
    return lines


def report(raw: list[Probe], args: argparse.Namespace, seconds: float, capacities: list[Capacity] | None = None) -> str:
    probes = cells(raw)
    best = {name: max((p.rate for p in ps if p.passes(args.p95_target)), default=0.0) for name, ps in probes.items()}
    lines = [
        "# Batching benchmark: no batching vs request-level vs continuous batching",
        "",
        f"Shipped {args.model} model, {device_text(args)}, beam {args.beam_size}, one test_2016_flickr sentence per "
        f"request, Poisson arrivals for {args.duration:.0f} s per rate, {args.repeats} repetitions per rate "
        f"(seeds {args.seed}..{args.seed + args.repeats - 1}; medians reported; the configurations take turns "
        f"within each repetition), p95 target "
        f"{args.p95_target:.2f} s, request timeout {args.timeout:.0f} s"
        + (f"; run took {seconds / 60:.1f} min." if seconds else "."),
        "",
        "Sizes: " + "; ".join(f"{name}: {sizes_text(name, args)}" for name in probes) + ".",
        "",
        "## Highest rate sustained with median p95 under the target and no failed request",
        "",
        "| configuration | max rate (req/s) | vs none | vs request |",
        "|---|---:|---:|---:|",
    ]
    for name in probes:
        ratios = [f"{best[name] / best[base]:.2f}x" if best.get(base) else "n/a" for base in ("none", "request")]
        lines.append(f"| {name} | {best[name]:.1f} | {ratios[0]} | {ratios[1]} |")
    lines += [
        "",
        "The same probes against tighter p95 targets (highest probed rate that passes; the sweep "
        "refines only the main target):",
        "",
        "| configuration | " + " | ".join(f"p95 <= {t:.2f} s" for t in OTHER_TARGETS) + " |",
        "|---|" + "---:|" * len(OTHER_TARGETS),
    ]
    for name, ps in probes.items():
        tight = [max((p.rate for p in ps if p.passes(t)), default=0.0) for t in OTHER_TARGETS]
        lines.append(f"| {name} | " + " | ".join(f"{c:.1f}" for c in tight) + " |")
    lines += capacity_lines(capacities or [])
    lines += [
        "",
        "## Every rate (medians of the repetitions; p95 range = lowest..highest repetition)",
        "",
        "| configuration | offered req/s | completed/s | p50 s | p95 s | p95 range s | p99 s | failed | within "
        "target |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for ps in probes.values():
        for p in ps:
            spread = [r.p95 for r in raw if r.config == p.config and r.rate == p.rate]
            lines.append(
                f"| {p.config} | {p.rate:.1f} | {p.throughput:.1f} | {p.p50:.3f} | {p.p95:.3f} | "
                f"{min(spread):.3f}..{max(spread):.3f} | {p.p99:.3f} | {p.failed} | "
                f"{'yes' if p.passes(args.p95_target) else 'no'} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="en-de")
    ap.add_argument("--configs", default="none,request,continuous")
    ap.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=RATES)
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of arrivals per run")
    ap.add_argument("--repeats", type=int, default=3, help="runs per rate and configuration (medians reported)")
    ap.add_argument("--bisect", type=int, default=2, help="bisection probes after the first miss")
    ap.add_argument("--p95-target", type=float, default=1.0, help="seconds")
    ap.add_argument("--timeout", type=float, default=20.0, help="request deadline, seconds (past it: failed)")
    ap.add_argument("--beam-size", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--sizes-for",
        choices=("cpu", "cuda"),
        help="take this device's batch sizes where a configuration gives none (default: --device's, as a replica does)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--static-slots",
        action="store_true",
        help="continuous mode on the static decode state (CUDA graphs on a GPU), as Settings.static_slots",
    )
    ap.add_argument(
        "--compiled-step",
        action="store_true",
        help="the static decode state's step compiled by inductor before serving, as Settings.compiled_step "
        "(implies --static-slots)",
    )
    ap.add_argument(
        "--capacity-sentences",
        type=int,
        default=512,
        help="sentences per capacity burst, measured before every rate (0: none)",
    )
    ap.add_argument("--out", type=Path, help="write the markdown report here (and .json beside it)")
    ap.add_argument("--from-json", type=Path, help="rewrite the report from an earlier run's .json (no decoding)")
    args = ap.parse_args()
    if args.from_json:
        saved = json.loads(args.from_json.read_text(encoding="utf-8"))
        if isinstance(saved, list):  # written before capacity bursts were measured
            saved = {"probes": saved, "capacity": []}
        text = report([Probe(**p) for p in saved["probes"]], args, 0.0, [Capacity(**c) for c in saved["capacity"]])
        emit(text, args.out, saved.get("provenance"))  # the run's commit and command, not this rewrite's
        return
    started = time.perf_counter()
    tr = Translator.load(args.model, args.device, num_threads=args.threads)
    with gzip.open(DATA / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        sources = [tr.encode(line.strip()) for line in f if line.strip()]
    runs, capacities = sweep(tr, args.configs.split(","), sources, args)
    text = report(runs, args, time.perf_counter() - started, capacities)
    stamp = provenance()
    emit(text, args.out, stamp)
    if args.out:
        saved = {"probes": [asdict(p) for p in runs], "capacity": [asdict(c) for c in capacities], "provenance": stamp}
        args.out.with_suffix(".json").write_text(json.dumps(saved, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
