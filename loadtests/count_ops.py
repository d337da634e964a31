"""Operator calls per decoder step: request-level decoding (translate_ids) vs continuous batching (InflightBatch).

    python loadtests/count_ops.py [--sentences 64] [--beam-size 4]

Where a step is bound by the host issuing work (a GPU, see docs/benchmarks.md), its cost follows
the number of operator calls more than their size. This counts every call that reaches PyTorch's
dispatcher (views included) while the same sentences decode both ways on CPU, once all at once
through `translate_ids` and once all joining one `InflightBatch`, and divides by the decoder steps
(log_softmax calls: one per step, the continuous first step in `add` included). One more row decodes
them as request-level batching does at saturation, in batches of 64 sentences.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from model import DecodeOptions, Translator  # noqa: E402
from model.decode.inflight import InflightBatch  # noqa: E402

DATA = Path(os.environ.get("BEAMSERVE_DATA", REPO.parent / "shared" / "data" / "multi30k"))


class CountCalls(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts operator calls by name."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.calls: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.calls[str(func)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def steps(self) -> int:
        return sum(n for name, n in self.calls.items() if "log_softmax" in name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sentences", type=int, default=64)
    ap.add_argument("--beam-size", type=int, default=4)
    args = ap.parse_args()
    tr = Translator.load("en-de", "cpu", num_threads=1)
    with gzip.open(DATA / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        sources = [tr.encode(line.strip()) for line in f if line.strip()][: args.sentences]
    opts = DecodeOptions(beam_size=args.beam_size, max_batch_size=args.sentences)
    search = tr.search_options(opts)
    caps = tr.max_lengths(sources, opts).tolist()

    def request() -> None:
        tr.translate_ids(sources, opts)

    def continuous() -> None:
        batch = InflightBatch(tr.model, rows=args.sentences * args.beam_size, max_length=max(caps))
        batch.add(list(range(len(sources))), sources, caps, search)
        while batch.rows:
            batch.step()

    def request_batches() -> None:
        tr.translate_ids(sources, DecodeOptions(beam_size=args.beam_size, max_batch_size=64))

    print(f"{len(sources)} sentences, beam {args.beam_size}:\n")
    print("| decoding | steps | operator calls | per step |\n|---|---:|---:|---:|")
    runs = (
        ("request-level, all at once (translate_ids)", request),
        ("continuous, all at once (InflightBatch)", continuous),
        ("request-level, batches of 64", request_batches),
    )
    with torch.inference_mode():
        for name, run in runs:
            run()  # warm-up
            with CountCalls() as count:
                run()
            total = sum(count.calls.values())
            print(f"| {name} | {count.steps} | {total} | {total / max(count.steps, 1):.0f} |")


if __name__ == "__main__":
    main()
