"""The decoder's GEMM shapes, side by side on CPU: float32 F.linear (MKL sgemm) against model.kernels.gemm.linear
(oneDNN, weights packed once), and every exact int8 kernel of model/kernels/int8_kernels.py (each a whole int8
linear layer: quantising the rows, the product, the scale-back; the same bits), with the one
model/kernels/int8_choice.py picks for the row count; where the packed kernel multiplies with AVX-VNNI, the same
kernel with AVX2's products alone too.

    python loadtests/bench_gemm.py [--threads 1] [--d-model 256] [--ffn 1024] [--vocab 8000] [--out FILE]
    python loadtests/bench_gemm.py --d-model 512 --ffn 2048 --vocab 58101      # OPUS-MT-base's shapes
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reports import emit

from model.kernels import int8_choice, native
from model.kernels.gemm import linear
from model.kernels.int8_kernels import multiply, with_forms
from model.kernels.quant import quantize_weight

ROWS = (1, 4, 16, 64, 256)


def best_us(fn: Callable[[], object], rounds: int = 5, least_s: float = 0.02) -> float:
    """The best of `rounds` rounds, each calls of fn for least_s, in microseconds a call."""
    fn()
    start = time.perf_counter()
    fn()
    n = max(1, int(least_s / max(time.perf_counter() - start, 1e-7)))
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - start) / n * 1e6)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--ffn", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--out", type=Path, help="write the markdown report here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    C = args.d_model
    shapes = {"q/k/v": (3 * C, C), "ffn fc1": (args.ffn, C), "ffn fc2": (C, args.ffn), "output": (args.vocab, C)}
    kernels = int8_choice.candidates()
    # Where the packed kernel multiplies with AVX-VNNI, the same kernel with AVX2's products alone beside it.
    avx2_alone = native.vnni_isa() == "avx-vnni" and "vnni" in kernels
    lines = [
        "# GEMMs on CPU: float32 and every exact int8 kernel",
        "",
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; microseconds a call (best of 5 rounds). "
        "int8 columns: the whole layer (rows quantised, product, scale-back); `chosen`: what int8_choice picked "
        "at load for that row count.",
        "",
        "| shape | rows | F.linear | oneDNN float32 | "
        + " | ".join(f"int8 {k}" for k in kernels)
        + (" | int8 vnni, AVX2 alone" if avx2_alone else "")
        + " | chosen |",
        "|---|---|---|---|" + "---|" * (len(kernels) + avx2_alone) + "---|",
    ]
    with torch.inference_mode():
        for name, (n_out, n_in) in shapes.items():
            w, b = torch.randn(n_out, n_in) * 0.05, torch.randn(n_out)
            plan = int8_choice.plan(n_out, n_in)
            base = quantize_weight(w)
            q = with_forms(base.qweight, base.scale, kernels)
            for rows in ROWS:
                x = torch.randn(rows, n_in)
                f32 = best_us(lambda x=x, w=w, b=b: F.linear(x, w, b))
                ours = best_us(lambda x=x, w=w, b=b: linear(x, w, b))
                int8 = [best_us(partial(multiply, k, x, q, b, False)) for k in kernels]
                if avx2_alone:
                    native.allow_avx_vnni(False)
                    int8.append(best_us(partial(multiply, "vnni", x, q, b, False)))
                    native.allow_avx_vnni(True)
                chosen = plan[min(int8_choice.bucket(rows), len(plan) - 1)]
                lines.append(
                    f"| {name} ({n_in}->{n_out}) | {rows} | {f32:.1f} | {ours:.1f} | "
                    + " | ".join(f"{t:.1f}" for t in int8)
                    + f" | {chosen} |"
                )
                print(lines[-1], flush=True)
    emit("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
