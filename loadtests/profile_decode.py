"""Profile one decode of the shipped en-de model: where the time goes, per operator, and host time
against device time per decoder step.

    python loadtests/profile_decode.py --device cuda            # today's path, batches of 64
    python loadtests/profile_decode.py --device cuda --slots    # the static decode state, CUDA graphs
    python loadtests/profile_decode.py --compute-type int8 --threads 1
"""

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
from model.decode.slot_decoder import PoolShape, SlotDecoder, decode_all  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None)
    p.add_argument("--compute-type", default=None, help="float32, int8, bfloat16, ... (model/kernels/compute_type.py)")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads (default: every CPU)")
    p.add_argument("--beam-size", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "multi30k")
    p.add_argument("--slots", action="store_true", help="decode through the static decode state (--batch slots)")
    args = p.parse_args()
    import os

    data = Path(os.environ.get("BEAMSERVE_DATA", args.data))
    tr = Translator.load(
        "en-de", args.device, dtype=args.dtype, compute_type=args.compute_type, num_threads=args.threads
    )
    with gzip.open(data / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        texts = [line.strip() for line in f][: args.batch * 2]
    enc = sorted((tr.encode(t) for t in texts), key=len)
    opts = DecodeOptions(beam_size=args.beam_size, max_batch_size=args.batch)
    steps = [0]
    if args.slots:
        shape = PoolShape(slots=args.batch, beams=args.beam_size, target_len=256, source_len=tr.max_source_tokens)
        pool = SlotDecoder(tr.model, shape, device=tr.device, graphs=tr.device.type == "cuda")

        def run() -> None:
            before = pool._launches
            decode_all(pool, enc, [opts] * len(enc), lag=1 if tr.device.type == "cuda" else 0)
            steps[0] = pool._launches - before
    else:

        def run() -> None:
            tr.translate_ids(enc, opts)

    run()  # warm-up (and, with --slots on CUDA, the graphs' capture)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    sync()
    start = time.perf_counter()
    run()
    sync()
    print(f"{len(enc)} sentences, beam {args.beam_size}, batch {args.batch}: {time.perf_counter() - start:.3f}s")
    acts = [torch.profiler.ProfilerActivity.CPU]
    if args.device.startswith("cuda"):
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    cpu_start = time.process_time()
    with torch.profiler.profile(activities=acts) as prof:
        run()
        sync()
    host = time.process_time() - cpu_start
    events = prof.key_averages()
    print(events.table(sort_by="self_cpu_time_total", row_limit=20))
    device = sum(getattr(e, "self_device_time_total", 0) for e in events) / 1e6
    per = (
        f" over {steps[0]} steps: {host / steps[0] * 1e3:.2f} ms host, {device / steps[0] * 1e3:.2f} ms device a step"
        if steps[0]
        else ""
    )
    print(f"host CPU time {host:.3f} s, device time {device:.3f} s{per}")


if __name__ == "__main__":
    main()
