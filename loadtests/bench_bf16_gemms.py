"""bfloat16 on CPU two ways, side by side with float32: every weight and activation in bfloat16 (what
compute_type="bfloat16" does), against bfloat16 GEMMs only (oneDNN's packed path; activations cast to
bfloat16 for each GEMM, everything else float32). Shipped en-de, beam 4, batch 64, one thread each,
sentences per CPU second, best of --repeats, each configuration in its own process, rounds in turn.

python loadtests/bench_bf16_gemms.py [--sentences 512] [--repeats 3] [--rounds 2]
"""

from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CONFIGS = ("float32", "bfloat16", "bfloat16-gemms")


def gemms_in_bfloat16() -> None:
    """Route model.kernels.gemm.linear's float32 calls through bfloat16 copies of the weights, packed once."""
    import model.kernels.gemm as gemm
    import model.kernels.onednn as onednn
    import model.nn.layers as layers
    import model.nn.transformer as transformer

    plain = gemm.linear
    packed: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}

    def linear(
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        activation: str | None = None,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if x.dtype != torch.float32 or torch.is_grad_enabled() or onednn.LINEAR is None:
            return plain(x, weight, bias, activation, residual)
        if id(weight) not in packed:  # (the weight itself kept alive, so its id stays its own)
            w = torch.ops.mkldnn._reorder_linear_weight(weight.to(torch.bfloat16), onednn.PACK_ROWS)
            packed[id(weight)] = (weight, w, None if bias is None else bias.to(torch.bfloat16))
        _, w, b = packed[id(weight)]
        rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        post_op = "none" if activation is None else gemm.FUSED_ACTIVATIONS[activation]
        y = onednn.LINEAR(rows, w, b, post_op, [], "")  # type: ignore[operator]
        y = y.float().view(*x.shape[:-1], weight.shape[0])
        return y if residual is None else residual + y

    gemm.linear = layers.linear = transformer.linear = linear  # type: ignore[assignment]


def run(config: str, sentences: int, repeats: int, data: Path) -> float:
    from model import DecodeOptions, Translator

    if config == "bfloat16-gemms":
        gemms_in_bfloat16()
    tr = Translator.load("en-de", "cpu", compute_type=config.split("-")[0], num_threads=1)
    with gzip.open(data / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        texts = [line.strip() for line in f][:sentences]
    ids = sorted((tr.encode(t) for t in texts), key=len)
    opts = DecodeOptions(beam_size=4, max_batch_size=64)
    tr.translate_ids(ids[:64], opts)  # warm-up
    best = 0.0
    for _ in range(repeats):
        start = time.process_time()
        tr.translate_ids(ids, opts)
        best = max(best, len(ids) / (time.process_time() - start))
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sentences", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--config", choices=CONFIGS, help=argparse.SUPPRESS)  # one configuration, in a worker
    args = p.parse_args()
    data = Path(os.environ.get("BEAMSERVE_DATA", REPO.parent / "shared" / "data" / "multi30k"))
    if args.config:
        print(run(args.config, args.sentences, args.repeats, data))
        return
    results: dict[str, list[float]] = {c: [] for c in CONFIGS}
    for r in range(args.rounds):
        for config in CONFIGS:
            cmd = [sys.executable, __file__, "--config", config, "--sentences", str(args.sentences)]
            out = subprocess.run([*cmd, "--repeats", str(args.repeats)], check=True, capture_output=True, text=True)
            results[config].append(float(out.stdout.split()[-1]))
            print(f"round {r + 1}/{args.rounds} {config}: {results[config][-1]:.1f} sentences/CPU s", flush=True)
    print("\n| configuration | sentences per CPU second (each round) | vs float32 |\n|---|---|---:|")
    for config, values in results.items():
        ratio = max(values) / max(results["float32"])
        print(f"| {config} | {', '.join(f'{v:.1f}' for v in values)} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
