"""The decoder's GEMM shapes, side by side on CPU: F.linear (MKL sgemm) vs model.kernels.gemm.linear (oneDNN,
float32), and the two int8 paths of model/kernels/quant.py (torch._int_mm vs oneDNN's prepacked int8 matmul,
each with its scaling passes; the same bits).

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

from model.kernels.gemm import linear
from model.kernels.quant import Int8Weight, linear_int8, onednn_int8, quantize_weight


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
    print(
        "| shape | rows | F.linear | oneDNN float32 | ratio | int8 `_int_mm` | int8 oneDNN | ratio |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    with torch.inference_mode():
        for name, (n_out, n_in) in shapes.items():
            w, b = torch.randn(n_out, n_in) * 0.05, torch.randn(n_out)
            packed = quantize_weight(w)
            plain = Int8Weight(packed.qweight, packed.scale)  # no oneDNN copy: torch._int_mm
            for rows in (4, 16, 64, 256):
                x = torch.randn(rows, n_in)
                ref = best_ms(lambda x=x, w=w, b=b: F.linear(x, w, b))
                ours = best_ms(lambda x=x, w=w, b=b: linear(x, w, b))
                int_mm = best_ms(lambda x=x, b=b, q=plain: linear_int8(x, q, b))
                # Where oneDNN's int8 matmul is a reference loop (quant.onednn_int8() False) it is not timed.
                cells = "reference loop | |"
                if onednn_int8():
                    onednn = best_ms(lambda x=x, b=b, q=packed: _onednn_int8(x, q, b))
                    cells = f"{onednn:.3f} | {int_mm / onednn:.2f}x |"
                print(
                    f"| {name} ({n_in}->{n_out}) | {rows} | {ref:.3f} | {ours:.3f} | {ref / ours:.2f}x "
                    f"| {int_mm:.3f} | {cells}",
                    flush=True,
                )


def _onednn_int8(x: torch.Tensor, q: Int8Weight, b: torch.Tensor) -> torch.Tensor:
    """model.kernels.quant's oneDNN path whatever the size (linear_int8 keeps _int_mm for small products)."""
    from model.kernels import quant

    saved = quant.ONEDNN_MIN_WEIGHT
    quant.ONEDNN_MIN_WEIGHT = 0
    try:
        return linear_int8(x, q, b)
    finally:
        quant.ONEDNN_MIN_WEIGHT = saved


if __name__ == "__main__":
    main()
