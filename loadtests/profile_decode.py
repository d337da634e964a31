"""Profile one decode: where the time goes, per operator, and host time against device time per decoder step.

    python loadtests/profile_decode.py --device cuda              # the shipped en-de, batches of 64
    python loadtests/profile_decode.py --device cuda --slots      # the static decode state, CUDA graphs
    python loadtests/profile_decode.py --device cuda --compiled   # that state's step through inductor first
    python loadtests/profile_decode.py --device cuda --model base --slots   # OPUS-MT-base's shapes
    python loadtests/profile_decode.py --compute-type int8 --threads 1

--model: a shipped model (en-de, en-fr) decoding naturally, or one of bench_decode's random models (base,
nllb-600m) decoding exactly --steps tokens, as bench_decode runs them.
"""

from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "loadtests"))

from bench_decode import RANDOM_MODELS, cell_options, make_base_model, make_nllb_model  # noqa: E402

from model import DecodeOptions, Translator  # noqa: E402
from model.decode.slot_decoder import PoolShape, SlotDecoder, decode_all  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="en-de", help="en-de, en-fr, or a random model: base, nllb-600m")
    p.add_argument("--steps", type=int, default=32, help="tokens each sentence decodes on a random model")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None)
    p.add_argument("--compute-type", default=None, help="float32, int8, bfloat16, ... (model/kernels/compute_type.py)")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads (default: every CPU)")
    p.add_argument("--beam-size", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "multi30k")
    p.add_argument("--slots", action="store_true", help="decode through the static decode state (--batch slots)")
    p.add_argument("--compiled", action="store_true", help="the static state's step through inductor (implies --slots)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as work:
        profile(args, _model_dir(args.model, Path(work)))


def _model_dir(name: str, work: Path) -> Path | str:
    """A shipped model's name, or a random model of those shapes built under `work`."""
    if name == "base":
        return make_base_model(work)
    if name == "nllb-600m":
        return make_nllb_model(work)
    return name


def profile(args: argparse.Namespace, model: Path | str) -> None:
    import os

    data = Path(os.environ.get("BEAMSERVE_DATA", args.data))
    cuda = args.device.startswith("cuda")
    tr = Translator.load(model, args.device, dtype=args.dtype, compute_type=args.compute_type, num_threads=args.threads)
    with gzip.open(data / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        texts = [line.strip() for line in f][: args.batch * 2]
    lang = "eng_Latn" if tr.languages else None  # a model with language tokens: its source's first
    enc = sorted((tr.encode(t, lang=lang) for t in texts), key=len)
    if args.model in RANDOM_MODELS:  # random weights rarely emit </s>: exactly --steps tokens, as bench_decode
        opts = cell_options(args.beam_size, args.steps, max_batch_size=args.batch)
    else:
        opts = DecodeOptions(beam_size=args.beam_size, max_batch_size=args.batch)
    steps = [0]
    if args.slots or args.compiled:
        shape = PoolShape(slots=args.batch, beams=args.beam_size, target_len=256, source_len=tr.max_source_tokens)
        pool = SlotDecoder(
            tr.model, shape, device=tr.device, graphs=cuda, compiled=args.compiled, kernels=tr.step_kernels
        )

        def run() -> None:
            before = pool._launches
            decode_all(pool, enc, [opts] * len(enc), lag=1 if cuda else 0)
            steps[0] = pool._launches - before
    else:

        def run() -> None:
            tr.translate_ids(enc, opts)

    run()  # warm-up (and with --slots on CUDA the graphs' capture, with --compiled the compilation)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    run()
    sync()
    path = "compiled static state" if args.compiled else "static state" if args.slots else "translate_ids"
    print(
        f"{args.model}, {path}: {len(enc)} sentences, beam {args.beam_size}, batch {args.batch}: "
        f"{time.perf_counter() - start:.3f}s"
    )
    acts = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    cpu_start = time.process_time()
    with torch.profiler.profile(activities=acts) as prof:
        run()
        sync()
    host = time.process_time() - cpu_start
    events = prof.key_averages()
    print(events.table(sort_by="self_cpu_time_total", row_limit=20))
    if cuda:  # the kernels by device time, those the replayed graphs launch included
        print(events.table(sort_by="self_device_time_total", row_limit=25))
    device = sum(getattr(e, "self_device_time_total", 0) for e in events) / 1e6
    per = (
        f" over {steps[0]} steps: {host / steps[0] * 1e3:.2f} ms host, {device / steps[0] * 1e3:.2f} ms device a step"
        if steps[0]
        else ""
    )
    print(f"host CPU time {host:.3f} s, device time {device:.3f} s{per}")
    if cuda:  # the device's own events: kernels (and copies), in graphs or not
        kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
        print(f"device events {kernels}" + (f", {kernels / steps[0]:.0f} a step" if steps[0] else ""))


if __name__ == "__main__":
    main()
