"""model.kernels.gemm: the oneDNN inference GEMM agrees with F.linear, and training keeps autograd."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from model.kernels.gemm import Linear, linear, packed, uses_onednn


@pytest.mark.parametrize("rows", [1, 7, 256])  # one row is given a zero row for company (model/kernels/gemm.py)
@pytest.mark.parametrize("activation", [None, "relu", "swish"])
def test_inference_linear_equals_f_linear(rows: int, activation: str | None) -> None:
    torch.manual_seed(0)
    x, w, b = torch.randn(rows, 3, 256), torch.randn(512, 256), torch.randn(512)  # (N, T, C_in)
    ref = F.linear(x, w, b)
    ref = {"relu": F.relu, "swish": F.silu}.get(activation or "", lambda t: t)(ref)
    with torch.inference_mode():
        out = linear(x, w, b, activation)
    assert out.shape == (rows, 3, 512)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize(("c_in", "c_out"), [(256, 256), (256, 1024), (1024, 256), (256, 8000), (2048, 512)])
def test_a_row_of_a_float32_product_is_the_same_bits_beside_any_number_of_rows(c_in: int, c_out: int) -> None:
    # What makes a sentence's float32 translation independent of its batch (tests/test_compute_type.py).
    torch.manual_seed(c_in + c_out)
    x, w, b = torch.randn(256, c_in), torch.randn(c_out, c_in) * 0.05, torch.randn(c_out)
    with torch.inference_mode():
        alone = linear(x[:1], w, b)
        for rows in (2, 3, 4, 13, 64, 100, 256):
            assert torch.equal(linear(x[:rows], w, b)[:1], alone), rows
        assert torch.equal(linear(x[:4], w, b, "swish")[:1], linear(x[:1], w, b, "swish"))


def test_onednn_is_used_for_cpu_float32_inference_only() -> None:
    x = torch.randn(4, 8)
    with torch.inference_mode():
        assert uses_onednn(x) == torch.backends.mkldnn.is_available()
        assert not uses_onednn(x.double())
    assert not uses_onednn(x)  # grad enabled: training keeps F.linear


def test_linear_module_trains() -> None:
    torch.manual_seed(0)
    layer = Linear(8, 4)
    layer(torch.randn(5, 8)).sum().backward()
    assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0


def test_unknown_activation_is_refused() -> None:
    with pytest.raises(ValueError, match="gelu"):
        linear(torch.randn(2, 4), torch.randn(3, 4), None, "gelu")


def test_packed_weight_is_reused_and_follows_weight_changes() -> None:
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN")
    torch.manual_seed(0)
    layer = Linear(256, 512)
    x = torch.randn(64, 256)  # 8M multiply-adds: the oneDNN path
    with torch.inference_mode():
        assert uses_onednn(x)
        assert packed(layer.weight) is packed(layer.weight)  # reordered once, not per call
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-4, rtol=1e-5)
    with torch.no_grad():
        layer.weight.mul_(-2.0)  # an in-place update (an optimizer step, a loaded state dict)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-4, rtol=1e-5)


def test_weights_made_under_inference_mode_are_packed_too() -> None:
    """Inference tensors keep no version counter: their packed copy is made once and reused."""
    with torch.inference_mode():
        w, x = torch.randn(512, 256), torch.randn(64, 256)
        assert w.is_inference() and uses_onednn(x)
        torch.testing.assert_close(linear(x, w), F.linear(x, w), atol=1e-4, rtol=1e-5)
        first = packed(w)
        assert packed(w) is first  # reused, not reordered again
        assert first.is_mkldnn and not w.is_mkldnn  # oneDNN's blocked copy, not the weight itself
        torch.testing.assert_close(linear(x, w), F.linear(x, w), atol=1e-4, rtol=1e-5)
        assert packed(w) is first


@pytest.mark.parametrize(("c_in", "c_out"), [(256, 768), (1024, 256), (256, 8000), (700, 100), (1500, 33)])
def test_the_c_float32_gemm_serves_few_rows_with_onednn_s_bits(c_in: int, c_out: int) -> None:
    from model.kernels import f32_gemm, native, onednn

    if not native.f32() or onednn.LINEAR is None:
        pytest.skip("no float32 C kernel in this build (AVX-512, or AVX2 with FMA), or no oneDNN")
    torch.manual_seed(c_in + c_out)
    w, b = torch.randn(c_out, c_in) * 0.05, torch.randn(c_out)
    with torch.inference_mode():
        for rows in (1, 2, 4, 7, 16, 64, 65, 130, 256, 257):  # C up to 64 rows (256 for a small weight), then oneDNN
            x, res = torch.randn(rows, c_in), torch.randn(rows, c_out)
            for bias in (b, None):
                assert torch.equal(linear(x, w, bias), onednn.linear(x, w, bias)), rows
                assert torch.equal(linear(x, w, bias, residual=res), res + onednn.linear(x, w, bias)), rows
    if not f32_gemm.agrees(c_out, c_in):
        pytest.skip(f"the C kernel sums otherwise than oneDNN at ({c_out}, {c_in}) here: oneDNN served every call")
    assert f32_gemm.form(w) is not None  # and it was the C kernel that served the few rows
    small = c_out * c_in <= f32_gemm.WIDE_WEIGHT  # and a small weight's up to 256
    served = [True, small, small, False]
    assert [f32_gemm.serving(w, rows) is not None for rows in (64, 65, 256, 257)] == served


AVX2 = """
import torch
from model.kernels import c_gemm, f32_gemm, native, onednn
from model.kernels.gemm import linear

assert native.LEVEL == 3 and native.f32()
torch.manual_seed(0)
w, b = torch.randn(768, 256) * 0.05, torch.randn(768)
with torch.inference_mode():
    for rows in (1, 4, 16, 17, 64, 65, 256, 257):
        x = torch.randn(rows, 256)
        assert torch.equal(linear(x, w, b), onednn.linear(x, w, b)), rows
served = [f32_gemm.serving(w, rows) is not None for rows in (256, 257)]
# oneDNN's AVX2 blocks of K (all of it up to 1,024, then 1,024 each) at a feed-forward's fc2 and a wider one's
blocks = [f32_gemm.agrees(256, 1024), f32_gemm.agrees(64, 2500)]
print(f32_gemm.agrees(768, 256), f32_gemm.swish_agrees(768, 256), served, blocks)
"""


def test_the_avx2_build_serves_a_float32_gemm_with_onednns_avx2_bits() -> None:
    from model.kernels import native

    if platform.machine() != "x86_64" or not native.built() or native.ENV in os.environ:
        pytest.skip("the builds per x86-64 level are made on x86-64 with a C compiler")
    if native.LEVEL is None or native.LEVEL < 3:
        pytest.skip("this CPU does not run x86-64-v3")
    env = {**os.environ, native.ENV: "x86-64-v3", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    out = subprocess.run([sys.executable, "-c", AVX2], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[-2] == "True True [True, False] [True, True]"


def test_a_c_float32_gemm_that_sums_otherwise_than_onednn_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    from model.kernels import c_gemm, f32_gemm, native, ops

    if not native.f32():
        pytest.skip("no float32 C kernel in this build (AVX-512, or AVX2 with FMA)")
    real = c_gemm.f32_linear

    def off_by_one_ulp(x: torch.Tensor, w: c_gemm.F32Weight, bias: torch.Tensor | None, residual=None):  # type: ignore[no-untyped-def]
        y = real(x, w, bias, residual)
        return torch.nextafter(y, torch.full_like(y, float("inf")))

    monkeypatch.setattr(ops, "f32_linear", off_by_one_ulp)  # the call f32_gemm makes
    monkeypatch.setattr(f32_gemm, "_AGREES", {})
    assert not f32_gemm.agrees(48, 80)
    w = torch.randn(48, 80)
    with torch.inference_mode():
        assert f32_gemm.linear(torch.randn(4, 80), w, None, None) is None  # oneDNN serves
