"""The C int8 row kernels (model/native.py): built where the install had a C compiler, and giving the
same bits as model/quant.py's PyTorch ops, kernel by kernel and for whole int8 translations."""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path

import pytest
import torch

from model import DecodeOptions, Translator, native
from model.quant import linear_int8, quantize_rows, quantize_weight

from .conftest import read_lines

WHY_NOT = f"turned off ({native.ENV}=0)" if os.environ.get(native.ENV) == "0" else "not built or not vectorised here"
built = pytest.mark.skipif(not native.available(), reason=f"the C kernels are {WHY_NOT}")
quantizes = pytest.mark.skipif(not native.quantizes(), reason=f"the C quantisation is {WHY_NOT}")


def test_the_kernels_are_built_where_the_install_had_a_c_compiler_and_run_where_they_vectorise() -> None:
    # setup.py builds them as optional, so a broken build would only show as slower int8 decoding.
    if platform.system() != "Linux" or not shutil.which("cc") or native.ENV in os.environ:
        return
    assert native.built()
    flags = set(Path("/proc/cpuinfo").read_text().split())
    if platform.machine() == "x86_64":
        assert native.quantizes() == ({"avx512f", "avx512bw"} <= flags)
        assert native.scales_back() == ({"avx2", "fma", "bmi2", "movbe"} <= flags)


def _activations(rows: int, cols: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(rows * 1000 + cols)
    x = torch.randn(rows, cols, generator=g) * torch.logspace(-3, 3, rows)[:, None]  # rows of every magnitude
    x[0] = 0.0  # a row of zeros takes the smallest scale
    if cols > 3:
        x[-1, 3] = -x[-1].abs().max() * 2  # the largest magnitude negative
    return x


@quantizes
@pytest.mark.parametrize("cols", [1, 15, 16, 17, 64, 256, 1000, 1024])
def test_quantize_rows_gives_torchs_bits(cols: int) -> None:
    x = _activations(9, cols)
    q, scale = native.quantize_rows(x)
    ref_q, ref_scale = quantize_rows(x)
    assert torch.equal(scale, ref_scale)
    assert torch.equal(q, ref_q)
    # rows of a wider tensor (a row stride above the width)
    wide = _activations(9, cols + 5)
    q, scale = native.quantize_rows(wide[:, :cols])
    ref_q, ref_scale = quantize_rows(wide[:, :cols])
    assert torch.equal(q, ref_q) and torch.equal(scale, ref_scale)


SHAPES = [(1, 256, 8000), (2, 256, 256), (7, 64, 17), (256, 256, 1024), (33, 1024, 256)]  # rows, K, N


@built
@pytest.mark.parametrize(("rows", "k", "n"), SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_an_int8_linear_gives_the_same_bits_with_and_without_the_kernels(
    rows: int, k: int, n: int, bias: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = torch.Generator().manual_seed(rows + k + n)
    w, x = torch.randn(n, k, generator=g) * 0.05, torch.randn(rows, k, generator=g) * 3
    b = torch.randn(n, generator=g) if bias else None
    q = quantize_weight(w)
    with torch.inference_mode():
        fast = linear_int8(x, q, b)
        monkeypatch.setattr(native, "_LIB", None)
        assert not native.available()
        assert torch.equal(fast, linear_int8(x, q, b))


@built
def test_int8_translations_are_the_same_with_and_without_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    texts = read_lines("test_2016_flickr.en.gz", 24)
    tr = Translator.load("en-de", "cpu", compute_type="int8")
    sources, opts = [tr.encode(t) for t in texts], DecodeOptions(beam_size=4, num_hypotheses=2)
    fast = tr.translate_ids(sources, opts)
    monkeypatch.setattr(native, "_LIB", None)
    slow = tr.translate_ids(sources, opts)
    assert [[(h.tokens, h.score) for h in hs] for hs in fast] == [[(h.tokens, h.score) for h in hs] for hs in slow]
