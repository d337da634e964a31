"""cuDNN attention on or off for decoding on a GPU (why Translator.load turns it off on CUDA).

    python loadtests/probe_cudnn_attention.py          # both settings, each in its own process
    python loadtests/probe_cudnn_attention.py --cudnn on

cuDNN's attention builds an execution plan for each new shape. Decoding one sentence at a time meets
a new (source length, cache length) at nearly every step, and a continuously batched engine a new
row count too. The probe times, with the shipped en-de model at beam 4: sentences decoded alone
(new shapes, then the same ones again with their plans cached) and a burst of 200 requests through
the engine in continuous and request mode (first burst, then a second one).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from model import DecodeOptions, Translator  # noqa: E402
from service.batching import BatchingConfig  # noqa: E402
from service.engine.engine import Engine  # noqa: E402

DATA = Path(os.environ.get("BEAMSERVE_DATA", REPO.parent / "shared" / "data" / "multi30k"))


def probe(cudnn: bool, device: str) -> None:
    tr = Translator.load("en-de", device, num_threads=2)
    torch.backends.cuda.enable_cudnn_sdp(cudnn)  # after load, which turns it off
    with gzip.open(DATA / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        ids = [tr.encode(line.strip()) for line in f][:400]
    opts = DecodeOptions(beam_size=4)

    def timed(label: str, fn: Callable[[], object]) -> None:
        if tr.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if tr.device.type == "cuda":
            torch.cuda.synchronize()
        print(f"cudnn {'on ' if cudnn else 'off'}  {label:34s} {time.perf_counter() - start:7.3f} s", flush=True)

    timed("8 sentences alone (warm-up)", lambda: [tr.decode_batch([x], opts) for x in ids[:8]])
    timed("60 sentences alone (new shapes)", lambda: [tr.decode_batch([x], opts) for x in ids[8:68]])
    timed("the same 60 again", lambda: [tr.decode_batch([x], opts) for x in ids[8:68]])
    for mode in ("continuous", "request"):
        engine = Engine(tr, BatchingConfig(mode=mode), max_length=256)

        async def burst(chunk: list[list[int]], engine: Engine = engine) -> None:
            await asyncio.gather(*(engine.translate([x], opts, 60) for x in chunk))

        timed(f"{mode}: burst of 200 (first)", lambda: asyncio.run(burst(ids[68:268])))
        timed(f"{mode}: burst of 200 (second)", lambda: asyncio.run(burst(ids[200:400])))
        engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cudnn", choices=["on", "off"], help="one setting here (default: both, each in a process)")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    if args.cudnn:
        probe(args.cudnn == "on", args.device)
        return
    for setting in ("off", "on"):
        subprocess.run([sys.executable, __file__, "--cudnn", setting, "--device", args.device], check=True)


if __name__ == "__main__":
    main()
