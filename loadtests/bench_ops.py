"""What calling the C kernels through their PyTorch operators (model/kernels/ops.py) would cost, side by side in one
process: each operator's call against the library's call alone at a decode step's shapes, and one-sentence decoding
(beam 4, one thread) with the model's kernel calls made through the dispatcher against made directly, passes
interleaved, the same tokens out of both. The model calls the library directly when eager and the operators while
torch.compile traces it; this measures why.

    python loadtests/bench_ops.py [--sentences 64] [--rounds 6] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import test_sentences
from reports import emit

import model.decode.search
import model.kernels.f32_gemm
import model.kernels.int8_kernels
import model.kernels.log_softmax
import model.nn.blocks
import model.nn.kv_cache
import model.nn.layers
import model.nn.transformer
from model import DecodeOptions, Translator
from model.kernels import c_gemm, native, ops

CALLERS = (
    model.kernels.int8_kernels, model.kernels.f32_gemm, model.kernels.log_softmax, model.decode.search,
    model.nn.layers, model.nn.blocks, model.nn.kv_cache, model.nn.transformer,
)  # fmt: skip


def best_us(fn: Callable[[], object], n: int = 2000) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n)
    return best * 1e6


def per_call(vocab: int, d_model: int) -> list[str]:
    """One call of each kernel a one-sentence step makes, at its shapes (4 beam rows), as µs."""
    g = torch.Generator().manual_seed(0)
    x, h = torch.randn(4, d_model, generator=g), torch.randn(4, vocab, generator=g)
    bias, calls = torch.randn(vocab, generator=g), []
    if native.vnni():
        w = c_gemm.VnniWeight(
            torch.randint(-127, 128, (vocab, d_model), dtype=torch.int8, generator=g), torch.rand(vocab)
        )
        calls.append(("int8 output projection + log-softmax", lambda: c_gemm.vnni_linear(x, w, bias, log_softmax=True),
                      lambda: ops.Traced.vnni_linear(x, w, bias, log_softmax=True)))  # fmt: skip
    if native.f32():
        f = c_gemm.F32Weight(torch.randn(vocab, d_model, generator=g))
        calls.append(("float32 output projection", lambda: c_gemm.f32_linear(x, f, bias),
                      lambda: ops.Traced.f32_linear(x, f, bias)))  # fmt: skip
    calls.append(("log-softmax", lambda: native.log_softmax_(h), lambda: ops.Traced.log_softmax_(h)))
    lines = ["| kernel call | library (µs) | operator (µs) | more per call (µs) |", "|---|---:|---:|---:|"]
    with torch.inference_mode():
        for name, direct, op in calls:
            a, b = best_us(direct), best_us(op)
            lines.append(f"| {name} | {a:.2f} | {b:.2f} | {b - a:+.2f} |")
    return lines


def decoding(compute_type: str, sentences: int, rounds: int) -> str:
    tr = Translator.load("en-de", "cpu", compute_type=compute_type, num_threads=1)
    ids = [tr.encode(t) for t in test_sentences(sentences)]
    opts = DecodeOptions(beam_size=4)
    spent: dict[str, list[float]] = {"library": [], "operator": []}
    tokens: dict[str, list[list[int]]] = {}
    through = {"library": ops, "operator": ops.Traced}
    for r in range(rounds):
        for mode in ("library", "operator") if r % 2 == 0 else ("operator", "library"):
            for caller in CALLERS:
                caller.ops = through[mode]  # type: ignore[attr-defined]
            start = time.process_time()
            out = [tr.decode_batch([i], opts)[0][0].tokens for i in ids]
            spent[mode].append((time.process_time() - start) / len(ids) * 1e3)
            tokens.setdefault(mode, out)
    for caller in CALLERS:
        caller.ops = ops  # type: ignore[attr-defined]
    a, b = statistics.median(spent["library"]), statistics.median(spent["operator"])
    same = "yes" if tokens["library"] == tokens["operator"] else "NO"
    return f"| {compute_type} | {a:.2f} | {b:.2f} | {b / a:.3f} | {same} |"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sentences", type=int, default=64)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if not native.built():
        sys.exit("the C kernels are not built or turned off here: nothing to compare")
    torch.set_num_threads(1)
    lines = ["# The C kernels' calls: the library's own against their PyTorch operators", ""]
    lines += [
        "One call at a one-sentence step's shapes (4 beam rows, en-de: d_model 256, 8,000 tokens); best of 5:",
        "",
    ]
    lines += per_call(8000, 256)
    lines += ["", f"One sentence at a time, beam 4, one thread, {args.sentences} test sentences; ms of process CPU a "
              f"sentence, the median of {args.rounds} interleaved passes each:", ""]  # fmt: skip
    lines += ["| compute type | library | operator | operator / library | same tokens |", "|---|---:|---:|---:|---|"]
    lines += [decoding(ct, args.sentences, args.rounds) for ct in ("int8", "float32")]
    emit("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
