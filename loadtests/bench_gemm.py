"""The decoder's GEMM shapes: F.linear (MKL sgemm) vs model.gemm.linear (oneDNN), side by side on CPU.

python loadtests/bench_gemm.py [--threads 2] [--d-model 256] [--ffn 1024] [--vocab 8000]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model.gemm import linear


def best_ms(fn: Callable[[], object], repeats: int = 5, n: int = 50) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - start) / n * 1000)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--ffn", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=8000)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    C = args.d_model
    shapes = {"attention proj": (C, C), "ffn fc1": (args.ffn, C), "ffn fc2": (C, args.ffn), "output": (args.vocab, C)}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; times in ms (best of 5)")
    print("| shape | rows | F.linear | oneDNN | ratio |\n|---|---|---|---|---|")
    with torch.inference_mode():
        for name, (n_out, n_in) in shapes.items():
            w, b = torch.randn(n_out, n_in), torch.randn(n_out)
            for rows in (16, 64, 256):
                x = torch.randn(rows, n_in)
                ref = best_ms(lambda x=x, w=w, b=b: F.linear(x, w, b))
                ours = best_ms(lambda x=x, w=w, b=b: linear(x, w, b))
                print(f"| {name} ({n_in}->{n_out}) | {rows} | {ref:.3f} | {ours:.3f} | {ref / ours:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
