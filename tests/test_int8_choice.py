"""The int8 kernel chosen per weight shape and row count (model/kernels/int8_choice.py): the fastest of the exact
kernels on the machine the test runs on, logged, and overridable by name."""

from __future__ import annotations

import logging
import statistics
from collections.abc import Iterator
from functools import partial

import pytest
import torch

from model.kernels import int8_choice, native
from model.kernels.int8_kernels import KERNELS, best_seconds, exact, multiply, with_forms

# The shipped models' shapes: the fused q/k/v projection, the feed-forward's two and the output projection.
SHAPES = [(768, 256), (1024, 256), (256, 1024), (8000, 256)]


def test_each_row_count_takes_the_kernel_it_timed_fastest_and_the_choice_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger=int8_choice.__name__):
        plan = int8_choice.plan(40, 72)  # a shape no model here has: measured now
    choice = int8_choice.chosen()[-1]
    assert (choice.N, choice.K, choice.plan) == (40, 72, plan)
    if len(int8_choice.candidates()) > 1:
        assert len(plan) == len(int8_choice.ROWS)  # 256 rows of it are far below MOST_MACS
        for kernel, times in zip(plan, choice.seconds, strict=True):  # VNNI credited with the step's saved call
            credited = {k: int8_choice.credited(k, t) for k, t in times.items()}
            assert kernel == min(credited, key=credited.__getitem__)
            assert set(times) <= set(int8_choice.candidates())
    assert "int8 GEMM (40 x 72, " in caplog.text
    if any("vnni" in times for times in choice.seconds):  # which instructions the packed kernel multiplies with
        assert f"vnni with {native.vnni_isa()}):" in caplog.text
    assert int8_choice.plan(40, 72) is plan  # measured once a shape


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op thread, as Translator.load chooses with: two threads' timings swing with whatever else runs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize(("N", "K"), SHAPES)
def test_the_chosen_kernel_is_not_the_slower_of_two_exact_ones_here(N: int, K: int, one_thread: None) -> None:
    kernels = int8_choice.candidates()
    if len(kernels) < 2:
        pytest.skip(f"one int8 kernel runs exactly here ({', '.join(kernels)}): nothing to choose")
    plan = int8_choice.plan(N, K)
    g = torch.Generator().manual_seed(N + K)
    q = with_forms(torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8), torch.rand(N, generator=g), kernels)
    for bucket, rows in ((0, 1), (1, 4)):  # a decode step's rows at batch 1, greedy and beam 4
        chosen = plan[min(bucket, len(plan) - 1)]
        x = torch.randn(rows, K, generator=g)
        # Taking turns, five rounds, each kernel's median: another test beside this one slows both alike.
        rounds: dict[str, list[float]] = {k: [] for k in kernels}
        with torch.inference_mode():
            for _ in range(5):
                for k in kernels:
                    rounds[k].append(best_seconds(partial(multiply, k, x, q, None, False), least_s=5e-3))
        median = {k: statistics.median(t) for k, t in rounds.items()}
        fastest = min(median, key=median.__getitem__)
        # A kernel 1.5x faster than the chosen one means the choice was wrong, not noise (VNNI may trail by the
        # Python call a decode step saves with it).
        slack = int8_choice.STEP_CALL_S if chosen == "vnni" else 0.0
        assert median[chosen] <= 1.5 * (1 + int8_choice.STEP_SHARE) * median[fastest] + slack, (
            rows,
            chosen,
            {k: f"{t * 1e6:.0f} us" for k, t in median.items()},
        )


def test_a_kernel_named_in_the_environment_serves_every_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    here = [k for k in KERNELS if exact(k)]
    monkeypatch.setenv(int8_choice.ENV, here[-1])
    int8_choice.candidates.cache_clear()
    monkeypatch.setattr(int8_choice, "_CHOSEN", {})
    try:
        assert int8_choice.plan(32, 64) == (here[-1],)
        monkeypatch.setenv(int8_choice.ENV, "fastest")
        int8_choice.candidates.cache_clear()
        with pytest.raises(ValueError, match="expected auto or one of"):
            int8_choice.plan(32, 65)
        missing = [k for k in KERNELS if not exact(k)]
        if missing:  # a kernel that does not run here is refused by name
            monkeypatch.setenv(int8_choice.ENV, missing[0])
            int8_choice.candidates.cache_clear()
            with pytest.raises(ValueError, match="does not run exactly here"):
                int8_choice.plan(32, 66)
    finally:
        int8_choice.candidates.cache_clear()
