"""Paired A/B of one code path against another in a single process: the speed of a module switch.

    python loadtests/bench_switch.py --set model.layers.SMALL_SOFTMAX_WIDTH=0 --rounds 10

"new" is the code as it stands; "old" is the same code with each --set MODULE.NAME=VALUE applied (the
switches the decode benchmark's beamserve-* systems use). Both decode the same test_2016_flickr
sentences with Translator.translate_ids, one after the other in each round, the order alternating
round by round, timed in the process's CPU time (keep --threads 1: with more, CPU time also counts
threads waiting on one another). On a shared machine one pass can run 5% slower than
the next: a ratio taken between separate processes, or from each side's best pass, moves that much
from run to run (bench_decode.py's beamserve-softmax read 1.05x and then 1.01x). Here each round's
two passes see the same neighbours, and the report gives the median of the per-round ratios with
their spread. It also counts the sentences whose best hypothesis differs between the two.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import importlib
import os
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from model import DecodeOptions, Translator  # noqa: E402
from model.search import Hypothesis  # noqa: E402

DATA = Path(os.environ.get("BEAMSERVE_DATA", REPO.parent / "shared" / "data" / "multi30k"))


def parse_switch(text: str) -> tuple[ModuleType, str, object]:
    """"package.module.NAME=VALUE" -> (module, NAME, VALUE as a Python literal)."""
    target, sep, value = text.partition("=")
    module_name, _, name = target.rpartition(".")
    if not sep or not module_name:
        raise argparse.ArgumentTypeError(f"expected MODULE.NAME=VALUE, got {text!r}")
    module = importlib.import_module(module_name)
    if not hasattr(module, name):
        raise argparse.ArgumentTypeError(f"{module_name} has no {name}")
    return module, name, ast.literal_eval(value)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", dest="switches", action="append", type=parse_switch, required=True,
                    metavar="MODULE.NAME=VALUE", help="applied for the old side (repeatable)")
    ap.add_argument("--model", default="en-de")
    ap.add_argument("--sentences", type=int, default=512)
    ap.add_argument("--beam-size", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    tr = Translator.load(args.model, "cpu", num_threads=args.threads)
    with gzip.open(DATA / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        sources = [tr.encode(line.strip()) for line in f][: args.sentences]
    # As bench_decode.py runs beamserve: no source-relative length cap.
    opts = DecodeOptions(beam_size=args.beam_size, max_batch_size=args.batch_size, max_length_ratio=None)
    new_values = [getattr(module, name) for module, name, _ in args.switches]

    def use(side: str) -> None:
        for (module, name, old), new in zip(args.switches, new_values, strict=True):
            setattr(module, name, old if side == "old" else new)

    def run(side: str) -> tuple[float, list[list[Hypothesis]]]:
        use(side)
        start = time.process_time()
        out = tr.translate_ids(sources, opts)
        return time.process_time() - start, out

    outputs = {side: run(side)[1] for side in ("new", "old")}  # warm-up, and the outputs compared
    times: dict[str, list[float]] = {"new": [], "old": []}
    for r in range(args.rounds):
        for side in ("new", "old") if r % 2 == 0 else ("old", "new"):
            times[side].append(run(side)[0])
        print(f"round {r + 1}/{args.rounds}: new {times['new'][-1]:.2f} s, old {times['old'][-1]:.2f} s",
              file=sys.stderr, flush=True)
    use("new")
    n = len(sources)
    ratios = [old / new for new, old in zip(times["new"], times["old"], strict=True)]
    differ = sum(a[0].tokens != b[0].tokens for a, b in zip(outputs["new"], outputs["old"], strict=True))
    switches = ", ".join(f"{m.__name__}.{name}={value!r}" for m, name, value in args.switches)
    print(f"old: {switches}; {n} sentences, beam {args.beam_size}, batches of {args.batch_size}, "
          f"{args.threads} thread(s), CPU time")
    for side in ("new", "old"):
        print(f"{side}: best {n / min(times[side]):.1f} sentences/s, median {n / statistics.median(times[side]):.1f}")
    print(f"new / old, paired by round: median {statistics.median(ratios):.3f}x "
          f"(min {min(ratios):.3f}x, max {max(ratios):.3f}x, {args.rounds} rounds)")
    print(f"best hypotheses that differ: {differ} of {n}")


if __name__ == "__main__":
    main()
