"""Profile one batch decode of the shipped en-de model: where the time goes, per operator."""

from __future__ import annotations

import argparse
import gzip
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from model import DecodeOptions, Translator  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None)
    p.add_argument("--beam-size", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "multi30k")
    args = p.parse_args()
    import os

    data = Path(os.environ.get("BEAMSERVE_DATA", args.data))
    tr = Translator.load("en-de", args.device, dtype=args.dtype)
    with gzip.open(data / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        texts = [line.strip() for line in f][: args.batch * 2]
    enc = sorted((tr.encode(t) for t in texts), key=len)
    opts = DecodeOptions(beam_size=args.beam_size, max_batch_size=args.batch)
    tr.translate_ids(enc, opts)  # warm-up
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    sync()
    start = time.perf_counter()
    tr.translate_ids(enc, opts)
    sync()
    print(f"{len(enc)} sentences, beam {args.beam_size}, batch {args.batch}: {time.perf_counter() - start:.3f}s")
    acts = [torch.profiler.ProfilerActivity.CPU]
    if args.device.startswith("cuda"):
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        tr.translate_ids(enc, opts)
        sync()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


if __name__ == "__main__":
    main()
