"""The memory one model replica takes: its weights, its engine's decode buffers at the device's sizes,
and on a GPU everything the process holds there (CUDA context, torch's cache), after a burst.

    python loadtests/replica_memory.py --device cuda                          # a GPU replica as served
    python loadtests/replica_memory.py --device cpu --dtype float16 --sizes-for cuda  # its tensors, on CPU
    python loadtests/replica_memory.py --model nllb-600m --device cpu --compute-type int8  # NLLB's shapes

`--model nllb-600m` builds a random model of NLLB-200-distilled-600M's shapes first, in a process of
its own (bench_decode.py's make_nllb_model); its sentences are translated English to German through its
language tokens. On CPU the report adds the process's resident set size after the burst.

How many replicas fit on one GPU (service/app.py gpu_share) is the GPU's memory over the last figure.
"""

from __future__ import annotations

import argparse
import gzip
import multiprocessing
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from reports import emit  # noqa: E402

from model import DecodeOptions, Translator  # noqa: E402
from service.batching import sized_for  # noqa: E402
from service.engine.engine import Engine  # noqa: E402

MIB = 2**20


def tensor_bytes(obj: object) -> int:
    """Bytes of the tensors an object holds in its attributes (one level of containers down)."""
    seen: dict[int, int] = {}
    for value in vars(obj).values():
        items = value if isinstance(value, list | tuple) else [value]
        for t in items:
            if isinstance(t, torch.Tensor):
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            elif hasattr(t, "__dict__") and not isinstance(t, torch.nn.Module):
                seen[id(t)] = tensor_bytes(t)
    return sum(seen.values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="en-de")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="default: float16 on cuda, float32 on cpu")
    p.add_argument("--compute-type", default=None, help="CTranslate2's names (int8, ...); instead of --dtype")
    p.add_argument("--sizes-for", default=None, help="the batching sizes of this device type (default: --device)")
    p.add_argument("--sentences", type=int, default=256, help="a burst of test sentences, beam 4, after loading")
    p.add_argument("--max-length", type=int, default=256, help="max_decoding_length of the burst's sentences")
    p.add_argument("--out", type=Path, help="write the markdown report here")
    args = p.parse_args()
    data = Path(os.environ.get("BEAMSERVE_DATA", REPO / "tests" / "data" / "multi30k"))
    with tempfile.TemporaryDirectory() as work:
        model = args.model
        if model == "nllb-600m":  # built in a process of its own: its memory is not the replica's
            from bench_decode import make_nllb_model

            builder = multiprocessing.get_context("spawn").Process(target=make_nllb_model, args=(Path(work),))
            builder.start()
            builder.join()
            if builder.exitcode:
                raise SystemExit(f"building the nllb-600m model failed (exit code {builder.exitcode})")
            model = Path(work) / "nllb-600m"
        measure(args, model, data)


def measure(args: argparse.Namespace, model: str | Path, data: Path) -> None:
    cuda = args.device.startswith("cuda")
    tr = Translator.load(model, args.device, dtype=args.dtype, compute_type=args.compute_type)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tr.model.state_dict().values()}
    weights = sum(storages.values())  # tied embeddings once
    config = sized_for(args.sizes_for or torch.device(args.device).type, {"mode": "continuous"})
    engine = Engine(tr, config, max_length=256)
    buffers = engine.call(lambda: tensor_bytes(engine.step_runner.batch)).result()  # type: ignore[union-attr]
    with gzip.open(data / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        texts = [line.strip() for line in f][: args.sentences]
    deadline = time.monotonic() + 600
    source, options = None, DecodeOptions(beam_size=4, max_decoding_length=args.max_length)
    if tr.languages:  # a model with language tokens: English to German
        source = "eng_Latn"
        options = replace(options, forced_bos_token_id=tr.tokenizer.language_id("deu_Latn"))
    items = [  # in requests of 16 sentences: every size's queue takes them
        item
        for i in range(0, len(texts), 16)
        for item in engine.submit([tr.encode(t, lang=source) for t in texts[i : i + 16]], options, deadline)
    ]
    for item in items:
        item.future.result(timeout=600)
    rows = [
        f"| weights ({tr.dtype}) | {weights / MIB:.1f} MiB |",
        f"| decode buffers ({config.decode_slots} slots, 256 positions) | {buffers / MIB:.1f} MiB |",
    ]
    if cuda:
        free, total = torch.cuda.mem_get_info()
        rows += [
            f"| torch's peak allocation, after {len(texts)} sentences at beam 4 | "
            f"{torch.cuda.max_memory_allocated() / MIB:.0f} MiB |",
            f"| torch's reserved cache | {torch.cuda.memory_reserved() / MIB:.0f} MiB |",
            f"| the GPU's memory in use (this process alone on it: CUDA context included) | "
            f"{(total - free) / MIB:.0f} MiB of {total / MIB:.0f} |",
        ]
    else:
        import psutil

        rows.append(
            f"| the process's resident set size, after {len(texts)} sentences at beam 4 | "
            f"{psutil.Process().memory_info().rss / MIB:.0f} MiB |"
        )
    engine.close()
    name = torch.cuda.get_device_name() if cuda else "CPU"
    sizes = args.sizes_for or args.device
    kind = tr.compute_type
    head = f"# One replica's memory\n\n{args.model}, {args.device} ({name}), {kind}, batching sizes of {sizes}.\n"
    emit(head + "\n| what | memory |\n|---|---:|\n" + "\n".join(rows) + "\n", args.out)


if __name__ == "__main__":
    main()
