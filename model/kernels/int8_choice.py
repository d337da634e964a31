"""Which exact int8 kernel (model/kernels/int8_kernels.py) multiplies a weight's rows on this CPU: measured once
per weight shape, at load, for a few row counts, and logged.

Every kernel gives the same bits, so the choice changes only the speed, and it may differ by the row count:
on a Zen 4 core the VNNI kernel multiplies a decode step's 4 rows by an (8000, 256) output projection 2.6x
faster than torch._int_mm, which is level with it at 64 rows and ahead at 256. A fixed rule per CPU family
would pick the slower one somewhere (the reason to measure: oneDNN's int8 matmul is a JIT kernel on Intel
and a reference loop on AMD, with the same flags in the same PyTorch build).

The `vnni` kernel is the packed one of csrc/int8_vnni.c, which multiplies with AVX2 where the CPU has no VNNI (the
log names which). BEAMSERVE_INT8_KERNEL=vnni (or onednn, int_mm, c) takes that kernel for every shape, where it is
exact here, to measure it or test it; unset or `auto`, the kernels are measured.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass

import torch

from model.kernels import native
from model.kernels.int8_kernels import KERNELS, Int8Weight, best_seconds, exact, multiply, with_forms

log = logging.getLogger(__name__)

ENV = "BEAMSERVE_INT8_KERNEL"
ROWS = (1, 4, 16, 64, 256)  # the row counts timed: a call's rows take the choice at the nearest (bucket)
MOST_MACS = 1 << 29  # past this many multiply-adds (a few ms) a row count is not timed: the last choice holds
LEAST_S = 2e-3  # each kernel's timing at a row count repeats calls for this long (a few calls' noise is ~20%)
SLOWER = 4.0  # a kernel this many times the best at one row count is not timed at the larger ones,
PRUNE_FROM = 16  # from this row count on: below it a call's fixed cost (oneDNN's, tens of us) hides its per-row one
# A decode step's and the encoder's layers run the VNNI kernel inside a few library calls (model/nn/c_step.py,
# c_encode.py); with any other kernel they go op by op, each GEMM a Python call costing about STEP_CALL_S more,
# and the layer's other ops beside it. VNNI is kept unless another kernel is faster by more than that call and
# STEP_SHARE of its time: a load on a busy machine times within a few percent at best, which would otherwise
# hand a near tie to the kernel that costs the layers their few-call path.
STEP_CALL_S = 10e-6
STEP_SHARE = 0.05


def bucket(rows: int) -> int:
    """The index in ROWS of the row count nearest to `rows` on a log scale."""
    return (rows > 2) + (rows > 8) + (rows > 32) + (rows > 128)


def kernel_at(plan: tuple[str, ...], rows: int) -> str:
    """The kernel a shape's plan gives a call of `rows` rows: its nearest timed row count's (the last past them)."""
    return plan[min(bucket(rows), len(plan) - 1)]


@functools.cache
def candidates() -> tuple[str, ...]:
    """The kernels that run here and compute the exact product (int8_kernels.exact), or the one ENV names."""
    setting = os.environ.get(ENV, "auto")
    if setting != "auto" and setting not in KERNELS:
        raise ValueError(f"{ENV}={setting!r}: expected auto or one of {', '.join(KERNELS)}")
    here = tuple(k for k in KERNELS if exact(k))
    if setting != "auto":
        if setting not in here:
            raise ValueError(f"{ENV}={setting}: that kernel does not run exactly here; these do: {', '.join(here)}")
        return (setting,)
    return here


@dataclass(frozen=True)
class Choice:
    """A weight shape's kernel for each timed row count (`plan`, ROWS' order) and the times it was chosen by."""

    N: int
    K: int
    threads: int
    plan: tuple[str, ...]
    seconds: tuple[dict[str, float], ...]  # per row count timed: kernel -> best seconds a call

    def __str__(self) -> str:
        if not self.seconds:
            return f"int8 GEMM ({self.N} x {self.K}): {self.plan[0]}, the one kernel exact here (or named in {ENV})"
        cells = []
        for rows, times in zip(ROWS, self.seconds, strict=False):
            best = min(times, key=times.__getitem__)
            others = ", ".join(
                f"{k} {t * 1e6:.0f}" for k, t in sorted(times.items(), key=lambda kt: kt[1]) if k != best
            )
            cells.append(f"{rows} rows: {best} {times[best] * 1e6:.0f} us" + (f" ({others})" if others else ""))
        isa = f"; vnni with {native.vnni_isa()}" if any("vnni" in times for times in self.seconds) else ""
        return f"int8 GEMM ({self.N} x {self.K}, {self.threads} threads{isa}): " + "; ".join(cells)


_CHOSEN: dict[tuple[int, int, int], Choice] = {}


def plan(N: int, K: int) -> tuple[str, ...]:
    """The kernel for each row bucket of an (N, K) weight, measured at the first weight of that shape (and
    intra-op thread count), logged at INFO."""
    threads = torch.get_num_threads()
    found = _CHOSEN.get((N, K, threads))
    if found is None:
        found = _measure(N, K, threads)
        _CHOSEN[N, K, threads] = found
        log.info("%s", found)
    return found.plan


def chosen() -> list[Choice]:
    """Every choice this process has measured, in the order made."""
    return list(_CHOSEN.values())


def _measure(N: int, K: int, threads: int) -> Choice:
    kernels = candidates()
    if len(kernels) == 1:
        return Choice(N, K, threads, kernels, ())
    gen = torch.Generator().manual_seed(N * 7919 + K)
    qweight = torch.randint(-127, 128, (N, K), generator=gen, dtype=torch.int8)
    q = with_forms(qweight, torch.rand(N, generator=gen) + 0.5, kernels)
    bias = torch.randn(N, generator=gen)
    plan: list[str] = []
    seconds: list[dict[str, float]] = []
    timed = list(kernels)
    with torch.inference_mode():
        for rows in ROWS:
            if plan and rows * N * K > MOST_MACS:
                break
            x = torch.randn(rows, K, generator=gen)
            times = {k: _time(k, x, q, bias) for k in timed}
            best = min(times, key=lambda k: credited(k, times[k]))
            plan.append(best)
            seconds.append(times)
            if rows >= PRUNE_FROM:
                timed = [k for k in timed if times[k] <= SLOWER * times[best]]
    return Choice(N, K, threads, tuple(plan), tuple(seconds))


def credited(kernel: str, seconds: float) -> float:
    """A kernel's time as the choice weighs it: VNNI's less what the layers' few-call path saves with it."""
    return (seconds - STEP_CALL_S) / (1 + STEP_SHARE) if kernel == "vnni" else seconds


def _time(kernel: str, x: torch.Tensor, q: Int8Weight, bias: torch.Tensor) -> float:
    return best_seconds(lambda: multiply(kernel, x, q, bias, False), least_s=LEAST_S)
