"""The C kernels (model/kernels/native.py): built where the install had a C compiler; the int8 row kernels give the
same bits as model/kernels/quant.py's PyTorch ops, kernel by kernel and for whole int8 translations; decode-step
attention agrees with PyTorch's to float32 rounding, computes each row alike in any batch, and reads a
beam's positions from its cache lineage as from copied rows."""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from model import DecodeOptions, Translator
from model.decode.search import NEG, top_candidates
from model.kernels import bindings, c_attention, c_gemm, c_layers, c_search, execution, f32_gemm, native, onednn
from model.kernels.int8_kernels import with_forms
from model.kernels.quant import linear_int8, quantize_rows, quantize_weight
from model.nn.kv_cache import KVCache
from model.nn.transformer import Seq2Seq

from .conftest import read_lines

WHY_NOT = f"turned off ({native.ENV}=0)" if os.environ.get(native.ENV) == "0" else "not built or not vectorised here"
built = pytest.mark.skipif(not native.available(), reason=f"the C kernels are {WHY_NOT}")
steps = pytest.mark.skipif(not native.built(), reason=f"the C kernels are {WHY_NOT}")
quantizes = pytest.mark.skipif(not native.quantizes(), reason=f"the C quantisation is {WHY_NOT}")


def test_the_kernels_are_built_where_the_install_had_a_c_compiler_and_run_where_they_vectorise() -> None:
    # setup.py builds them as optional, so a broken build would only show as slower int8 decoding.
    if platform.system() != "Linux" or not shutil.which("cc"):
        pytest.skip("setup.py builds the kernels where there is a C compiler; this check reads Linux's cpuinfo")
    if native.ENV in os.environ:
        pytest.skip(f"{native.ENV} chooses the build")
    assert native.built() and native.built() and native.in_use().startswith(f"{native.MODULE} (")
    flags = set(Path("/proc/cpuinfo").read_text().split())
    if platform.machine() == "x86_64":  # the library binds the best level this CPU runs
        v4, v3 = {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}, {"avx2", "fma", "bmi1", "bmi2", "movbe"}
        best = 4 if v4 | v3 <= flags else 3 if v3 <= flags else 1
        assert best == native.LEVEL
        assert native.quantizes() == (best >= 3)  # quantize.h's AVX2 and AVX-512 loops
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
    q, scale = c_gemm.quantize_rows(x)
    ref_q, ref_scale = quantize_rows(x)
    assert torch.equal(scale, ref_scale)
    assert torch.equal(q, ref_q)
    # rows of a wider tensor (a row stride above the width)
    wide = _activations(9, cols + 5)
    q, scale = c_gemm.quantize_rows(wide[:, :cols])
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
        monkeypatch.setattr(native, "_VECTORISED", 0)  # the int8 kernels off
        assert not native.available()
        assert torch.equal(fast, linear_int8(x, q, b))


@built
def test_int8_translations_are_the_same_with_and_without_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    texts = read_lines("test_2016_flickr.en.gz", 24)
    tr = Translator.load("en-de", "cpu", compute_type="int8")
    sources, opts = [tr.encode(t) for t in texts], DecodeOptions(beam_size=4, num_hypotheses=2)
    fast = tr.translate_ids(sources, opts)
    monkeypatch.setattr(native, "_VECTORISED", 0)  # the int8 kernels off, attention still in C
    slow = tr.translate_ids(sources, opts)
    assert [[(h.tokens, h.score) for h in hs] for hs in fast] == [[(h.tokens, h.score) for h in hs] for hs in slow]


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Each row's attention with PyTorch's ops, in float64: q (N, H, D), k, v (N, H, T, D) -> (N, H, D)."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    for n, t in enumerate(lengths):
        if t:
            scores = (k[n, :, :t].double() @ q[n, :, :, None].double())[..., 0] / q.shape[-1] ** 0.5  # (H, t)
            out[n] = (scores.softmax(-1)[:, None, :] @ v[n, :, :t].double())[:, 0]
    return out


@steps
@pytest.mark.parametrize(("H", "D"), [(4, 64), (8, 64), (2, 24), (16, 32), (1, 7)])
def test_step_attention_in_c_equals_the_formula_row_by_row_in_any_batch(H: int, D: int) -> None:
    g = torch.Generator().manual_seed(H * D)
    N, T = 19, 40
    q = torch.randn(N, H, D, generator=g) * 2
    k, v = torch.randn(N, H, T + 3, D, generator=g) * 2, torch.randn(N, H, T + 3, D, generator=g)
    k[3, :, :5] *= 40  # scores far apart: weights of exp(-80) and below
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    lengths[4], lengths[5] = 0, T  # a row with no positions yet: zeros
    out = c_attention.attend(q, k, v, lengths)
    torch.testing.assert_close(out.double(), _reference(q, k, v, lengths.tolist()), atol=2e-6, rtol=1e-5)
    assert not out[4].any()
    for n in (0, 3, 5, 18):  # each row alone: the same bits
        alone = c_attention.attend(q[n : n + 1].contiguous(), k[n : n + 1], v[n : n + 1], lengths[n : n + 1])
        assert torch.equal(alone, out[n : n + 1])
    same = torch.full((N,), 17)
    assert torch.equal(
        c_attention.attend(q, k, v, 17), c_attention.attend(q, k, v, same)
    )  # one length or a length a row


@steps
def test_step_attention_in_c_refuses_an_index_outside_the_cache_before_reading_it() -> None:
    N, H, T, D = 3, 2, 8, 64
    q, k, v = torch.randn(N, H, D), torch.randn(N, H, T, D), torch.randn(N, H, T, D)
    rows = torch.zeros(N, T, dtype=torch.int64)
    assert c_attention.attend(q, k, v, T, rows).shape == (N, H, D)
    for bad_rows, length in [
        (rows.clone().index_fill_(1, torch.tensor([5]), N), T),  # a cache row past the last
        (rows.clone().index_fill_(1, torch.tensor([0]), -1), T),  # a negative one
        (rows, T + 1),  # a position past the cache's
        (rows[:, :4], 6),  # past the positions `rows` names
        (rows[:2], T),  # fewer rows named than queries
    ]:
        with pytest.raises(IndexError, match="outside the cache"):
            c_attention.attend(q, k, v, length, bad_rows)
    with pytest.raises(IndexError):  # no rows named: query row n reads cache row n, which must exist
        c_attention.attend(torch.randn(N + 1, H, D), k, v, T)
    with pytest.raises(IndexError):  # a row's own length past the cache
        c_attention.attend(q, k, v, torch.tensor([1, T + 1, 2]))


@steps
def test_step_attention_in_c_reads_each_position_from_the_row_its_lineage_names() -> None:
    g = torch.Generator().manual_seed(7)
    N, H, T, D = 12, 4, 30, 64
    q, k, v = (
        torch.randn(N, H, D, generator=g),
        torch.randn(N, H, T, D, generator=g),
        torch.randn(N, H, T, D, generator=g),
    )
    rows = torch.randint(0, N, (N, T), generator=g)  # position t of row n lives in row rows[n, t]
    gathered = [x[rows, :, torch.arange(T)].permute(0, 2, 1, 3).contiguous() for x in (k, v)]  # (N, H, T, D)
    assert torch.equal(c_attention.attend(q, k, v, 23, rows), c_attention.attend(q, *gathered, 23))
    # One row a sentence at every position (cross-attention: a sentence's beams read its keys)
    sentence = torch.tensor([0, 0, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3])
    spread = [x[sentence].contiguous() for x in (k, v)]
    assert torch.equal(
        c_attention.attend(q, k, v, 30, sentence[:, None].expand(N, T)), c_attention.attend(q, *spread, 30)
    )


@steps
def test_a_self_attention_step_with_a_lineage_and_rows_at_their_own_positions_reads_each_rows_own_lineage() -> None:
    # continuous batching: rows of sentences that started at different steps, each beam reading its ancestors
    g = torch.Generator().manual_seed(11)
    N, H, T, D = 6, 2, 12, 16
    k, v = torch.randn(N, H, T, D, generator=g), torch.randn(N, H, T, D, generator=g)
    qkv = torch.randn(N, 3 * H * D, generator=g)
    pos = torch.tensor([3, 3, 7, 7, 0, 10])
    lineage = torch.randint(0, N, (N, T), generator=g)
    # as in a search, no row reads a row at the position that row writes now (its own, where it names itself)
    clash = pos[lineage] == torch.arange(T)
    lineage = torch.where(clash, torch.arange(N)[:, None], lineage)
    copied = [x.clone() for x in (k, v)]  # the same step over the rows each lineage names, copied into place
    for x in copied:
        x.copy_(x[lineage, :, torch.arange(T)].permute(0, 2, 1, 3))
    ours = c_attention.self_attend_step(qkv, k, v, pos, lineage)
    theirs = c_attention.self_attend_step(qkv, *copied, pos, None)
    assert torch.equal(ours, theirs)
    assert lineage[torch.arange(N), pos].tolist() == list(range(N))  # each row names itself where it wrote
    with pytest.raises(IndexError):  # a lineage naming a row outside the cache, before the row's position
        lineage[5, 2] = N
        c_attention.self_attend_step(qkv, k, v, pos, lineage)


@steps
@pytest.mark.parametrize("compute_type", ["float32", "int8"])
def test_translations_with_the_step_kernels_match_pytorchs_and_the_lineage_cache_the_copying_one(
    compute_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = read_lines("test_2016_flickr.en.gz", 48)
    tr = Translator.load("en-de", "cpu", compute_type=compute_type)
    sources, opts = [tr.encode(t) for t in texts], DecodeOptions(beam_size=4, num_hypotheses=2)
    digest = tr.digest
    c = tr.translate_ids(sources, opts)
    new_cache = Seq2Seq.new_cache

    def copying(self: Seq2Seq, *args: Any, **kwargs: Any) -> KVCache:
        return new_cache(self, *args, **{**kwargs, "lineage": False})

    monkeypatch.setattr(Seq2Seq, "new_cache", copying)  # reorders copy keys into the children's rows
    assert [[(h.tokens, h.score) for h in hs] for hs in c] == [
        [(h.tokens, h.score) for h in hs] for hs in tr.translate_ids(sources, opts)
    ]
    monkeypatch.setattr(native, "_LIB", None)  # attention, log-softmax and ranking in PyTorch's ops
    tr.model.use_plan(execution.probe())  # what computes here now: PyTorch's operators
    torch_ = tr.translate_ids(sources, opts)
    if compute_type == "float32":  # int8 rounds an activation otherwise now and then: 4 of the 1,000 test
        # sentences' best int8 translations differ (none in float32; the quality test holds int8's BLEU)
        assert [[h.tokens for h in hs] for hs in c] == [[h.tokens for h in hs] for hs in torch_]
        for a, b in zip(c, torch_, strict=True):
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)
    # The last bits differ, so a translation cache must tell them apart.
    assert Translator.load("en-de", "cpu", compute_type=compute_type).digest != digest


X86_LEVELS = [1, 3, 4]  # the builds in the library: 4, 8 and 16 floats a register


@steps
def test_the_kernels_refuse_what_their_buffers_cannot_hold_themselves_and_under_python_o() -> None:
    lib = _built(native.LEVEL or 1)
    lp, run = torch.randn(2, 4, 100), torch.zeros(2, 4)
    out = torch.empty(2, 80), torch.empty(2, 80, dtype=torch.int64), torch.empty(2, 80, dtype=torch.int64)
    # The C functions check before they touch memory: 65 candidates, or a head wider than 256 floats.
    assert (
        lib.beamserve_top_candidates(lp.data_ptr(), run.data_ptr(), 2, 4, 100, 65, *(t.data_ptr() for t in out)) == -2
    )
    q, k = torch.randn(1, 1, 300), torch.randn(1, 1, 2, 300)
    args = (1, 1, 300, *k.stride()[:3], 1, 2, None, 2, None, 0, 0, 0, 0, 1.0, torch.empty(300).data_ptr())
    assert lib.beamserve_attend(q.data_ptr(), k.data_ptr(), k.data_ptr(), *args) == -2
    # The wrappers' checks are not asserts: python -O keeps them.
    code = (
        "import torch; from model.kernels import c_search, native\n"
        "try: c_search.top_candidates(torch.randn(1, 4, 100), torch.zeros(1, 4), 65)\n"
        "except ValueError as e: print('refused:', e)\n"
        "try: native.int8_gemm(torch.zeros(2, 8, dtype=torch.int8), torch.zeros(3, 9, dtype=torch.int8))\n"
        "except ValueError as e: print('refused:', e)"
    )
    out_o = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, check=True).stdout
    assert out_o.count("refused:") == 2, out_o


@steps
@pytest.mark.parametrize(("M", "K", "N"), [(1, 512, 512), (2, 16, 4), (3, 37, 7), (9, 512, 2048), (64, 2048, 13)])
def test_the_int8_gemm_in_c_gives_the_exact_product(M: int, K: int, N: int) -> None:
    g = torch.Generator().manual_seed(M * K + N)
    wide = torch.randint(-127, 128, (M, K + 3), dtype=torch.int8, generator=g)
    x, w = wide[:, :K], torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g)  # x: rows of a wider tensor
    # the exact product (torch._int_mm saturates under ONEDNN_MAX_CPU_ISA=AVX2)
    assert torch.equal(native.int8_gemm(x, w), (x.long() @ w.long().t()).int())
    # 127 x 127 everywhere: the sums AVX2's 16-bit pair products would saturate
    full = torch.full((M, K), 127, dtype=torch.int8)
    assert torch.equal(native.int8_gemm(full, -full[:1].expand(N, K).contiguous()), torch.full((M, N), -127 * 127 * K))
    with pytest.raises(ValueError):
        native.int8_gemm(x, w[:, 1:].contiguous())


vnni = pytest.mark.skipif(
    not native.vnni(), reason="this CPU has neither AVX-512 VNNI nor AVX2, or the C kernels are not loaded"
)
# The packed int8 kernels: the x86-64-v3 build's (csrc/int8_avx2.c) with AVX2 alone and with AVX-VNNI, the
# x86-64-v4 build's (csrc/int8_vnni.c) with VNNI alone and with AMX's tiles
PACKED_INT8_BUILDS = ["x86-64-v3", "x86-64-v3+avxvnni", "x86-64-v4", "x86-64-v4+amx"]


@contextlib.contextmanager
def _allowed(has: Callable[[], int], allow: Callable[[int], None], allowed: bool) -> Iterator[None]:
    """A packed kernel's optional instructions (the x86-64-v3 build's AVX-VNNI, the x86-64-v4 build's AMX) allowed
    or not while the block runs, then as they were: off where they were off (the loaded build under a
    BEAMSERVE_NATIVE_KERNELS that turns them off), or where the CPU has none to turn on."""
    was = has()
    allow(int(allowed))
    try:
        yield
    finally:
        allow(int(was))


def _avx_vnni(library: bindings.Kernels, allowed: bool) -> contextlib.AbstractContextManager[None]:
    """library's x86-64-v3 packed kernel with AVX-VNNI (where the CPU has it) or with AVX2 alone."""
    return _allowed(library.beamserve_avx_vnni, library.beamserve_avx_vnni_allow, allowed)


def _amx(library: bindings.Kernels, allowed: bool) -> contextlib.AbstractContextManager[None]:
    """library's x86-64-v4 packed kernel with AMX (where the CPU has it) or with VNNI alone."""
    return _allowed(library.beamserve_vnni_amx, library.beamserve_amx_allow, allowed)


@vnni
@pytest.mark.parametrize("build", PACKED_INT8_BUILDS)
@pytest.mark.parametrize(
    ("M", "K", "N"),
    [
        *[(1, 512, 512), (2, 16, 4), (3, 37, 7), (5, 256, 8000), (9, 1024, 33), (64, 2048, 13)],
        # with AMX: whole blocks of 16 rows through the tiles (K a multiple of 64), odd panel counts, the rest VNNI's
        *[(16, 64, 16), (17, 128, 40), (33, 256, 1000), (47, 64, 33), (64, 1024, 96), (40, 100, 20)],
    ],
)
def test_the_vnni_kernels_give_the_exact_product_and_the_int8_paths_bits(
    M: int, K: int, N: int, build: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each build's packed kernel (x86-64-v3's: AVX2's sign and pair products, or AVX-VNNI's shifted bytes,
    # csrc/int8_avx2.c) over the one form.
    if platform.machine() != "x86_64":
        pytest.skip("the builds per x86-64 level are made on x86-64")
    level = bindings.LEVELS[build]
    library = _built(level)
    if library.beamserve_cpu_level() < level:
        pytest.skip(f"this CPU does not run x86-64-v{level}")
    with _avx_vnni(library, build != "x86-64-v3"), _amx(library, build.endswith("+amx")):
        if build.endswith("avxvnni") and not library.beamserve_avx_vnni():
            pytest.skip("this CPU has no AVX-VNNI")
        if build.endswith("+amx") and not library.beamserve_vnni_amx():
            pytest.skip("this CPU has no AMX (or Linux lends no tiles)")
        want = {"x86-64-v3": 1, "x86-64-v3+avxvnni": 3}.get(build, 2)
        assert library.beamserve_vnni() == want, f"{build}'s build multiplies otherwise"
        assert library.beamserve_vnni_amx() == build.endswith("+amx"), f"{build}'s build multiplies otherwise"
        monkeypatch.setattr(native, "_LIB", library)
        _check_packed(M, K, N)


def _check_packed(M: int, K: int, N: int) -> None:
    """The loaded packed kernel: the exact product, and the fused layer's bits against its steps in turn."""
    g = torch.Generator().manual_seed(M * K + N)
    wide = torch.randint(-127, 128, (M, K + 3), dtype=torch.int8, generator=g)
    x, w = wide[:, :K], torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g)  # x: rows of a wider tensor
    g_scale = torch.rand(N, generator=g) / 100
    packed = c_gemm.VnniWeight(w, g_scale)
    assert torch.equal(c_gemm.vnni_gemm(x, packed), (x.long() @ w.long().t()).int())
    # 127 x 127 everywhere, and -127 beside 127: the sums a 16-bit pair product would saturate
    full = torch.full((M, K), 127, dtype=torch.int8)
    assert torch.equal(
        c_gemm.vnni_gemm(full, c_gemm.VnniWeight(-full[:1].expand(N, K).contiguous(), g_scale)),
        torch.full((M, N), -127 * 127 * K),
    )
    # The fused layer: quantize_rows, the product, scale_back_ and a residual's addition to the bit
    xf, bias, res = torch.randn(M, K, generator=g), torch.randn(N, generator=g), torch.randn(M, N, generator=g)
    xq, xs = c_gemm.quantize_rows(xf)
    for b in (bias, None):
        want = c_gemm.scale_back_((xq.long() @ w.long().t()).int(), g_scale, xs, b)
        assert torch.equal(c_gemm.vnni_linear(xf, packed, b), want)
        assert torch.equal(c_gemm.vnni_linear(xf, packed, b, res), res + want)
    with pytest.raises(ValueError):  # rows longer than the packed weight's: it would be read past its end
        c_gemm.vnni_gemm(torch.cat([x, x[:, :4]], 1), packed)
    with pytest.raises(ValueError):
        c_gemm.vnni_linear(xf, packed, bias[1:])
    with pytest.raises(ValueError):
        c_gemm.vnni_linear(xf, packed, bias, res[:, 1:])


@vnni
def test_the_avx2_kernel_leaves_a_weight_holding_minus_128_to_the_16_bit_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # AVX2's kernel negates weight bytes by the activation's sign, and -128 has no negative in a byte.
    w = torch.randint(-127, 128, (16, 32), dtype=torch.int8, generator=torch.Generator().manual_seed(5))
    w[3, 7] = -128
    monkeypatch.setattr(native, "_PACKED", 1)
    with pytest.raises(ValueError, match="-128"):
        c_gemm.VnniWeight(w, torch.ones(16))
    q = with_forms(w, torch.ones(16), ("vnni", "vnni", "int_mm"))
    assert q.vnni is None and q.plan == ("c", "c", "int_mm")
    for shifted in (2, 3):  # VNNI's and AVX-VNNI's shifted bytes multiply it exactly
        monkeypatch.setattr(native, "_PACKED", shifted)
        assert with_forms(w, torch.ones(16), ("vnni",)).vnni is not None


def _linears_agree(tr: Translator) -> bool:
    """Whether the float32 C GEMM gives oneDNN's bits here at every weight shape of tr's layers, their fused q/k/v
    and the output projection: else oneDNN keeps some, and no step is one call (the AVX2 build's at K = 1,024)."""
    shapes = {tuple(m.weight.shape) for m in tr.model.modules() if isinstance(m, torch.nn.Linear)}
    C = tr.model.cfg.d_model
    return all(f32_gemm.agrees(*shape) for shape in shapes | {(3 * C, C), tuple(tr.model.embed.weight.shape)})


def _step_cases() -> tuple[list[tuple[torch.Tensor, ...]], list[torch.Tensor]]:
    """Fixed random inputs for the decode-step attention (q, k, v, lengths, rows) and log-softmax (logits)."""
    g = torch.Generator().manual_seed(3)
    cases = []
    for N, H, T, D in [(40, 4, 33, 64), (9, 3, 20, 24), (5, 2, 17, 100)]:
        q, k, v = (torch.randn(*shape, generator=g) for shape in [(N, H, D), (N, H, T, D), (N, H, T, D)])
        lengths, rows = torch.randint(0, T + 1, (N,), generator=g), torch.randint(0, N, (N, T), generator=g)
        cases.append((q, k, v, lengths, rows))
    return cases, [torch.randn(7, V, generator=g) * 5 for V in (8000, 33, 1)]


def _built(level: int) -> bindings.Kernels:
    """The library's build of an x86-64 level (setup.py's, installed beside the package), its functions bound."""
    lib = bindings.library()
    assert lib is not None, "setup.py did not build the library"
    return bindings.Kernels(lib, level)


def _assert_same_bits(library: bindings.Kernels, monkeypatch: pytest.MonkeyPatch) -> None:
    """library's attention, log-softmax, int8 GEMMs (the packed layer where both builds have one: VNNI's, AVX2's)
    and (where both builds have it) float32 GEMM and swish give the loaded build's bits on fixed random inputs."""
    cases, logits = _step_cases()
    loaded = [c_attention.attend(*case) for case in cases]
    log_probs = [native.log_softmax_(x.clone()) for x in logits]
    g = torch.Generator().manual_seed(4)
    xq, wq = (torch.randint(-127, 128, shape, dtype=torch.int8, generator=g) for shape in [(9, 520), (37, 520)])
    product = native.int8_gemm(xq, wq)
    packs = native.vnni() and bool(library.beamserve_vnni())
    if packs:
        packed, xf = c_gemm.VnniWeight(wq, torch.rand(37, generator=g)), torch.randn(9, 520, generator=g)
        layer = c_gemm.vnni_linear(xf, packed, None)
    # float32's GEMM (K past one block of 1,024, as oneDNN blocks it at AVX2 and AVX-512 alike; N past a whole panel
    # of 16) and its swish, where both builds have them
    floats = native.f32() and bool(library.beamserve_f32_gemm())
    w, bias, rows = torch.randn(37, 1100, generator=g), torch.randn(37, generator=g), torch.randn(13, 1100, generator=g)
    residual, swished = torch.randn(13, 37, generator=g), torch.randn(1000, generator=g) * 40
    if floats:
        form = c_gemm.F32Weight(w)
        sums = [
            c_gemm.f32_linear(rows[:m], form, b, r)
            for m in (1, 6, 13)
            for b in (bias, None)
            for r in (None, residual[:m])
        ]
        swish = c_gemm.f32_swish_(swished.clone())
    monkeypatch.setattr(native, "_LIB", library)
    for case, expected in zip(cases, loaded, strict=True):
        assert torch.equal(c_attention.attend(*case), expected)
    for x, expected in zip(logits, log_probs, strict=True):
        assert torch.equal(native.log_softmax_(x.clone()), expected)
    assert torch.equal(native.int8_gemm(xq, wq), product)
    if packs:
        assert torch.equal(c_gemm.vnni_linear(xf, packed, None), layer)
        if library.beamserve_avx_vnni():  # the x86-64-v3 build's AVX2 products too, beside its AVX-VNNI ones
            with _avx_vnni(library, False):
                assert torch.equal(c_gemm.vnni_linear(xf, packed, None), layer)
    if floats:
        again = [
            c_gemm.f32_linear(rows[:m], form, b, r)
            for m in (1, 6, 13)
            for b in (bias, None)
            for r in (None, residual[:m])
        ]
        assert all(torch.equal(a, b) for a, b in zip(again, sums, strict=True))
        assert torch.equal(c_gemm.f32_swish_(swished[:997].clone()), swish[:997])  # a tail of 5 lanes


@steps
@pytest.mark.parametrize("level", X86_LEVELS)
def test_the_step_kernels_give_the_same_bits_in_every_build(level: int, monkeypatch: pytest.MonkeyPatch) -> None:
    if platform.machine() != "x86_64" or not shutil.which("cc"):
        pytest.skip("the builds per x86-64 level are made on x86-64 with a C compiler")
    library = _built(level)
    if library.beamserve_cpu_level() < level:
        pytest.skip(f"this CPU does not run x86-64-v{level}")
    _assert_same_bits(library, monkeypatch)


@steps
@pytest.mark.slow
def test_clang_builds_every_library_and_its_build_gives_the_same_bits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The kernels use GCC's and clang's vector extensions alike; a build clang cannot compile would only
    # show as slower decoding, as setup.py's libraries are optional.
    if platform.system() != "Linux" or not shutil.which("clang"):
        pytest.skip("clang is not installed (make test installs Debian's)")
    root = Path(__file__).resolve().parents[1]
    build = [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib")]
    env = {**os.environ, "CC": "clang"}
    subprocess.run([*build, "--build-temp", str(tmp_path / "tmp")], cwd=root, env=env, check=True, capture_output=True)
    built = list((tmp_path / "lib" / "model" / "kernels").glob("_native*.so"))
    assert len(built) == 1, "clang did not build the library setup.py names"
    clangs = ctypes.CDLL(str(built[0]))
    # Each level this CPU runs computes the bits of GCC's build of that level.
    for level in X86_LEVELS if platform.machine() == "x86_64" else [1]:
        library = bindings.Kernels(clangs, level)
        if library.beamserve_cpu_level() < level:
            continue
        with monkeypatch.context() as patch:
            patch.setattr(native, "_LIB", _built(level))
            _assert_same_bits(library, patch)


@pytest.mark.parametrize(
    ("setting", "level"),
    [("x86-64-v3", "3"), ("x86-64-v3+avxvnni", "3"), ("x86-64-v2", "1"), ("x86-64", "1"), ("0", "None")],
)
def test_the_setting_binds_the_level_a_cpu_of_that_level_would(setting: str, level: str) -> None:
    if platform.machine() != "x86_64" or not native.built() or native.ENV in os.environ:
        pytest.skip("the builds per x86-64 level are made on x86-64 with a C compiler")
    env = {**os.environ, native.ENV: setting}
    code = (
        "from model.kernels import native; isa = native.vnni_isa() or '-'; native.allow_avx_vnni(False); "
        "print(native.LEVEL, isa, native.vnni_isa() or '-')"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    bound, isa, alone = out.stdout.split()
    assert bound == level
    if level == "3" and _built(3).beamserve_cpu_level() >= 3:  # AVX2's products, or AVX-VNNI's where asked and had
        avx_vnni = "avx_vnni" in Path("/proc/cpuinfo").read_text().split()
        assert isa == ("avx-vnni" if setting.endswith("avxvnni") and avx_vnni else "avx2")
        assert alone == "avx2"  # allow_avx_vnni(False): AVX2's products alone, for a side-by-side measurement


@vnni
@pytest.mark.skipif(not native.amx(), reason="this CPU has no AMX (or Linux lends no tiles)")
@pytest.mark.parametrize(("setting", "tiles"), [("x86-64-v4", "False"), ("x86-64-v4+amx", "True")])
def test_x86_64_v4_computes_as_a_cpu_without_amx_and_its_amx_setting_with_it(setting: str, tiles: str) -> None:
    env = {**os.environ, native.ENV: setting}
    code = "from model.kernels import native; print(native.LEVEL, native.vnni_isa(), native.amx())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["4", "avx512-vnni", tiles]


def test_a_setting_that_names_no_level_stops_the_import_and_says_which_it_takes() -> None:
    env = {**os.environ, native.ENV: "avx2"}
    failed = subprocess.run(
        [sys.executable, "-c", "import model.kernels.native"], env=env, capture_output=True, text=True
    )
    assert failed.returncode != 0 and "expected 0, 1 or one of x86-64" in failed.stderr


@steps
@pytest.mark.parametrize("V", [8000, 1000, 33, 5])
def test_log_softmax_in_c_is_within_float32_rounding_of_torchs_and_row_by_row(V: int) -> None:
    g = torch.Generator().manual_seed(V)
    x = torch.randn(40, V, generator=g) * 6
    x[1] = 0.0  # a flat row
    x[2, : V // 2] = -1e4  # half the row far below the rest
    out = native.log_softmax_(x.clone())
    torch.testing.assert_close(out, torch.log_softmax(x.double(), -1).float(), atol=2e-6, rtol=2e-6)
    for r in (0, 1, 2, 39):
        assert torch.equal(native.log_softmax_(x[r : r + 1].clone()), out[r : r + 1])
    wide = torch.zeros(40, V + 9)
    wide[:, :V] = x
    native.log_softmax_(wide[:, :V])  # rows of a wider tensor, in place
    assert torch.equal(wide[:, :V], out) and not wide[:, V:].any()


@steps
@pytest.mark.parametrize(("K", "V", "n"), [(4, 8000, 8), (1, 8000, 2), (5, 301, 10), (2, 7, 14), (4, 1000, 64)])
def test_candidate_ranking_in_c_gives_pytorchs_exact_answer(
    K: int, V: int, n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = torch.Generator().manual_seed(K * V + n)
    b = 16
    log_probs = torch.log_softmax(torch.randn(b, K, V, generator=g) * 3, dim=-1)
    log_probs[:, :, V // 3] = float("-inf")  # a suppressed token
    log_probs[0, :, 1:] = float("-inf")  # a sentence forced to end: one finite token a beam
    log_probs[2] = log_probs[2].round(decimals=1)  # many equal scores: ranked by beam, then token
    run_scores = torch.randn(b, K, generator=g) * 3
    run_scores[1, 1:] = NEG  # beams not yet expanded
    run_scores[2] = 0.0
    c = c_search.top_candidates(log_probs, run_scores, n)
    monkeypatch.setattr(native, "_LIB", None)  # PyTorch's plain and blockwise rankings
    for chunk in (None, 32):
        for ours, theirs in zip(c, top_candidates(log_probs, run_scores, n, chunk=chunk), strict=True):
            assert torch.equal(ours, theirs), chunk


@pytest.mark.parametrize("compute_type", ["int8", "float32"])
@pytest.mark.parametrize(("model", "beam_size"), [("en-de", 1), ("en-de", 4), ("nllb", 4)])
def test_a_step_by_segments_as_one_plan_its_sublayers_as_one_c_call_each_and_op_by_op_give_the_same_bits(
    model: str, beam_size: int, compute_type: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    # en-de's layers norm after each sublayer, the NLLB-shaped model's before
    from model.nn import c_step
    from model.nn.layers import FeedForward, MultiHeadAttention

    if not (native.vnni() if compute_type == "int8" else native.f32()):
        pytest.skip(f"no {compute_type} GEMM in C here (int8: AVX-512 VNNI; float32: AVX-512, or AVX2 with FMA)")
    where = request.getfixturevalue("nllb_dir") if model == "nllb" else model
    tr = Translator.load(where, "cpu", compute_type=compute_type)
    if compute_type == "float32" and not _linears_agree(tr):
        pytest.skip("the float32 C GEMM sums otherwise than oneDNN at a layer's shape here: no step is one call")
    texts = read_lines("test_2016_flickr.en.gz", 24)
    lang = "eng_Latn" if model == "nllb" else None
    sources = [tr.encode(t, lang=lang) for t in texts]
    opts = DecodeOptions(beam_size=beam_size, num_hypotheses=beam_size, max_decoding_length=24)

    def translations() -> list[list[tuple[list[int], float]]]:
        found = [tr.translate_ids([s], opts)[0] for s in sources[:12]] + tr.translate_ids(sources[12:], opts)
        return [[(h.tokens, h.score) for h in r] for r in found]

    segments: list[str] = []  # encoder and decoder by segments: one library call between two activations
    for name in ("decoder_layers", "encoder_layers", "decoder_segment", "encoder_segment"):
        call = getattr(c_layers, name)
        monkeypatch.setattr(c_layers, name, lambda *a, call=call, name=name: segments.append(name) or call(*a))
    plan = tr.plan  # what load decided
    one_call = translations()  # a step's every layer, with en-de's SiLU, projection and log-softmax, in one call
    ffn = tr.model.decoders[0].ffn
    exact = plan.silu_in_c if compute_type == "int8" else f32_gemm.swish_agrees(*ffn.fc1.weight.shape)
    one = ffn.activation == "swish" and plan.layer_norm_in_c and exact
    assert ("decoder_layers" in segments) == one and ("encoder_layers" in segments) == one
    tr.model.use_plan(plan.with_(one_call=False))
    segments.clear()
    by_segments = translations()
    assert set(segments) == {"decoder_segment", "encoder_segment"} or not plan.layer_norm_in_c
    # the encoder's modules; PyTorch's LayerNorm in the step
    tr.model.use_plan(plan.with_(one_call=False, layer_norm_in_c=False))
    planned: list[bool] = []  # c_step.run: every layer of a step in one loop of library calls
    run = c_step.run
    monkeypatch.setattr(c_step, "run", lambda *a: (found := run(*a), planned.append(found is not None))[0])
    whole = translations()
    assert any(planned), "the step plans did not run"
    monkeypatch.setattr(c_step, "run", lambda *a: None)
    calls: list[int] = []  # layer by layer, each sublayer one checked call
    self_sublayer = c_layers.self_sublayer
    monkeypatch.setattr(c_layers, "self_sublayer", lambda *a: calls.append(1) or self_sublayer(*a))
    layered = translations()
    assert calls, "the sublayers' calls did not run"
    monkeypatch.setattr(MultiHeadAttention, "c_sublayer", lambda *a, **k: None)
    monkeypatch.setattr(FeedForward, "_c_linears", lambda *a, **k: None)
    apart = translations()  # op by op
    assert one_call == by_segments == whole == layered == apart


@pytest.mark.parametrize("compute_type", ["int8", "float32"])
def test_a_beam_searchs_steps_in_one_call_give_the_bits_of_a_call_a_step_and_stop_at_the_caches_end(
    compute_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from model.decode import decoding

    if not (native.vnni() if compute_type == "int8" else native.f32()):
        pytest.skip(f"no {compute_type} GEMM in C here (int8: AVX-512 VNNI; float32: AVX-512, or AVX2 with FMA)")
    tr = Translator.load("en-de", "cpu", compute_type=compute_type)
    if compute_type == "float32" and not _linears_agree(tr):
        pytest.skip("the float32 C GEMM sums otherwise than oneDNN at a layer's shape here: no step is one call")
    sources = [tr.encode(t) for t in read_lines("test_2016_flickr.en.gz", 24)]
    opts = DecodeOptions(beam_size=4, num_hypotheses=4)

    def translations() -> list[list[tuple[list[int], float]]]:
        found = [tr.translate_ids([s], opts)[0] for s in sources[:8]] + tr.translate_ids(sources[8:], opts)
        return [[(h.tokens, h.score) for h in r] for r in found]

    ran: list[tuple[int, int]] = []  # each call's steps taken, and the sentences done at its last
    beam_steps = c_search.beam_steps
    monkeypatch.setattr(c_search, "beam_steps", lambda *a: (r := beam_steps(*a), ran.append((r[0], r[1][4])))[0])
    together = translations()
    assert ran and max(taken for taken, _ in ran) > 4 and all(ended for _, ended in ran)
    init = decoding.CachedStepper.__init__

    def short(self: decoding.CachedStepper, model: Seq2Seq, memory: torch.Tensor, *rest: Any) -> None:
        init(self, model, memory, *rest)  # then a cache of 2 positions, which a step one call at a time grows
        rows, length = self.cache.rows, self.cache.limit
        self.cache = model.new_cache(self.cache.capacity, 2, memory.dtype, memory.device, limit=length, lineage=True)
        self.cache.resize(rows, 0)

    monkeypatch.setattr(decoding.CachedStepper, "__init__", short)
    ran.clear()
    stopping = translations()
    assert any(not ended for _, ended in ran), "no call stopped at the cache's end"
    plan = tr.plan
    tr.model.use_plan(plan.with_(steps_in_c=False))
    ran.clear()
    apart = translations()  # a step, its beam step and its reorder one call each
    assert not ran
    assert together == stopping == apart
    monkeypatch.undo()
    tr.model.use_plan(plan)
    # A token outside the vocabulary is refused by name before anything is computed, as a step's own call refuses it.
    from model.decode.search import BeamState, advance_in_c

    ids, mask = decoding.pad_batch([sources[0]], tr.model.cfg.pad_token_id, torch.device("cpu"))
    with torch.inference_mode():
        stepper = decoding.CachedStepper(tr.model, tr.model.encode(ids, mask), mask, 4, 20)
        log_probs = stepper.step(torch.zeros(1, dtype=torch.long), 0).repeat_interleave(4, dim=0)
        state = BeamState.start(1, 4, 20, torch.device("cpu"))
        advance = advance_in_c(log_probs, state, torch.tensor([20]), tr.search_options(opts), tr.plan)
        assert advance is not None
        stepper.reorder(torch.zeros(4, dtype=torch.long), None)
        outside = torch.full((4,), (tr.model.target_embed or tr.model.embed).weight.shape[0], dtype=torch.long)
        with pytest.raises(IndexError, match="outside the embedding"):
            stepper.beam_steps(outside, 1, advance, torch.ones(19))


@pytest.mark.parametrize("compute_type", ["int8", "float32"])
def test_every_layers_source_keys_and_values_as_one_gemm_give_each_layers_own_projections_bits(
    compute_type: str,
) -> None:
    from model.decode.decoding import pad_batch

    tr = Translator.load("en-de", "cpu", compute_type=compute_type)
    texts = read_lines("test_2016_flickr.en.gz", 64)
    for batch in (texts[:1], texts[:5], texts):  # 64 sentences: past the float32 C kernel's rows, oneDNN's
        ids, mask = pad_batch([tr.encode(t) for t in batch], tr.model.cfg.pad_token_id, torch.device("cpu"))
        with torch.inference_mode():
            memory = tr.model.encode(ids, mask)
            cross = tr.model.cross_cache(memory, mask)
            S = memory.shape[1]
            for i, layer in enumerate(tr.model.decoders):
                k, v = layer.cross_attn.project_kv(memory)  # the layer's own k and v projections
                assert torch.equal(cross.keys(i)[:, :, :S], k) and torch.equal(cross.v[i][:, :, :S], v), (i, len(batch))


@pytest.mark.skipif(not native.built(), reason="the C kernels are not built")
@pytest.mark.parametrize("width", [1, 7, 8, 100, 256, 512, 1024, 2048, 4100, 40000])
def test_layer_norm_in_c_gives_torchs_bits_where_torchs_kernel_runs_8_fused_lanes(width: int) -> None:
    # PyTorch's AVX2 and AVX-512 builds run its LayerNorm kernel over 8 lanes with fused multiply-adds; its
    # baseline build (ATEN_CPU_CAPABILITY=default) does not, and there the check at load turns the C one off.
    capability = torch.backends.cpu.get_cpu_capability()
    assert native.layer_norms_exactly() == (capability in ("AVX2", "AVX512"))
    if not native.layer_norms_exactly():
        pytest.skip(f"PyTorch's LayerNorm kernel here ({capability}) is not the one the C one reproduces")
    g = torch.Generator().manual_seed(width)
    rows = 64 if width < 5000 else 4
    scales, offsets = torch.rand(rows, 1, generator=g) * 30, torch.randn(rows, 1, generator=g)
    x = torch.randn(rows, width, generator=g) * scales + offsets
    x[: rows // 4] = torch.randn(rows // 4, width, generator=g).exp() * 7  # skewed rows, as residual streams are
    weight, bias = torch.randn(width, generator=g), torch.randn(width, generator=g)
    expected = torch.native_layer_norm(x, (width,), weight, bias, 1e-5)[0]
    assert torch.equal(native.layer_norm(x, weight, bias, 1e-5), expected)


@pytest.mark.skipif(not native.built(), reason="the C kernels are not built")
def test_a_steps_embedding_in_c_gives_torchs_bits_and_refuses_an_id_outside_the_vocabulary() -> None:
    g = torch.Generator().manual_seed(3)
    weight, scale = torch.randn(50, 24, generator=g), math.sqrt(24)
    tokens = torch.tensor([3, 49, 0, 3])
    for at in (torch.randn(1, 24, generator=g), torch.randn(4, 24, generator=g)):
        assert torch.equal(c_layers.embed(tokens, weight, scale, at), F.embedding(tokens, weight) * scale + at)
    with pytest.raises(IndexError):
        c_layers.embed(torch.tensor([3, 50]), weight, scale, at[:1])


def test_a_build_without_a_compiler_says_so_and_fails_where_the_kernels_are_required(tmp_path: Path) -> None:
    """setup.py with a C compiler that fails (CC=false): the build goes on and prints a block naming the
    libraries not built; with BEAMSERVE_REQUIRE_KERNELS=1 it fails."""
    root = Path(__file__).resolve().parents[1]
    shutil.copy(root / "setup.py", tmp_path)
    shutil.copytree(root / "model" / "kernels" / "csrc", tmp_path / "model" / "kernels" / "csrc")
    command = [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", "out", "--build-temp", "tmp"]
    env = {**os.environ, "CC": "false"}
    env.pop("BEAMSERVE_REQUIRE_KERNELS", None)
    quiet = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 0, quiet.stderr
    assert "beamserve: the C kernels did not build (model.kernels._native" in quiet.stderr
    assert not list((tmp_path / "out").rglob("_native*.so"))
    env["BEAMSERVE_REQUIRE_KERNELS"] = "1"
    loud = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert loud.returncode != 0 and "model/kernels/csrc/" in loud.stderr


@vnni
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU's flags are read from /proc/cpuinfo")
def test_the_vnni_kernels_use_amx_where_the_cpu_has_it() -> None:
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    flags = set(next(line for line in lines if line.startswith("flags")).split())
    # AMX's tiles serve the VNNI kernel of the AVX-512 build (an AVX2 build bound on this CPU has neither)
    assert native.amx() == ({"amx_tile", "amx_int8"} <= flags and native.vnni_isa() == "avx512-vnni")


@pytest.mark.skipif(not native.built(), reason="the C kernels are not built")
@pytest.mark.parametrize("n", [1, 15, 16, 17, 31, 32, 33, 1024, 4096 + 24, 30000])
def test_silu_in_c_gives_torchs_bits_at_every_length_where_the_check_at_load_finds_them(n: int) -> None:
    # ATen takes whole pairs of vectors with SLEEF's expf and the rest lane by lane with the C library's: each
    # length's tail is computed as ATen computes it, on values from every binade, both signs and the cut-offs.
    if not native.silu_exactly():
        pytest.skip(f"the library's SiLU does not give this ATen's bits ({torch.backends.cpu.get_cpu_capability()})")
    g = torch.Generator().manual_seed(n)
    bits = torch.randint(-(2**31), 2**31, (n,), generator=g, dtype=torch.int64).to(torch.int32).view(torch.float32)
    ramp = torch.linspace(-110.0, 110.0, n)
    for x in (bits, ramp, torch.randn(n, generator=g) * 3):
        expected = F.silu(x)
        got = native.silu_(x.clone())
        same = (got.view(torch.int32) == expected.view(torch.int32)) | (got.isnan() & expected.isnan())
        assert bool(same.all()), x[~same][:4]


@pytest.mark.skipif(not native.f32() or onednn.LINEAR is None, reason="no float32 GEMM in C here (AVX-512)")
def test_swish_in_c_gives_onednns_fused_post_op_bits() -> None:
    # oneDNN's linear with its swish post-op through an identity weight is swish(x) itself: a million floats
    # from every binade (a stride through the finite bit patterns) and activations of every scale.
    values = torch.arange(0, 1 << 32, 4099, dtype=torch.int64)
    values = torch.where(values >= 1 << 31, values - (1 << 32), values).to(torch.int32).view(torch.float32)
    values = values[torch.isfinite(values) & (values != 0)]  # a zero row sums -0.0 to +0.0 through the GEMM
    x = torch.cat([values[: values.numel() // 256 * 256], torch.randn(64 * 256) * 6]).view(-1, 256)
    with torch.inference_mode():
        expected = onednn.linear(x, torch.eye(256), None, "swish")
    assert torch.equal(c_gemm.f32_swish_(x.clone()), expected)
    # the shipped model's fc1: where the C GEMM gives oneDNN's sums, with the swish it gives the fused call's bits
    assert f32_gemm.swish_agrees(1024, 256) == f32_gemm.agrees(1024, 256)


@pytest.mark.skipif(not native.built(), reason="the C kernels are not built")
def test_a_lineages_reorder_in_one_call_is_the_gather_of_its_rows_and_refuses_a_row_outside_it() -> None:
    lineage = torch.arange(6 * 9).view(6, 9)
    rows = torch.tensor([2, 2, 0, 5])  # rows naming each other and themselves
    expected = lineage.clone()
    expected[:4, :7] = lineage[rows, :7]
    c_attention.follow(lineage, rows, 7)
    assert torch.equal(lineage, expected)
    with pytest.raises(IndexError):
        c_attention.follow(lineage, torch.tensor([0, 6]), 3)
    with pytest.raises(IndexError):
        c_attention.follow(lineage, rows, 10)
    assert torch.equal(lineage, expected)  # nothing written by a refused call


@pytest.mark.skipif(not native.built(), reason="the C kernels are not built")
def test_cache_rows_moved_in_one_call_are_the_gathers_copies_and_rows_both_written_and_read_are_left_to_it() -> None:
    cache = KVCache(3, 10, 4, 16, 8, dtype=torch.float32, device=torch.device("cpu"))
    cache.k.copy_(torch.randn_like(cache.k))
    cache.v.copy_(torch.randn_like(cache.v))
    cache.length = 11
    dest, src = torch.tensor([1, 4, 2]), torch.tensor([7, 9, 8])  # rows moved into holes
    expected = [c.clone() for c in (cache.k, cache.v)]
    for c in expected:
        c[:, dest, :, :6] = c[:, src, :, :6]
    assert c_attention.copy_rows(cache.k, cache.v, dest, src, 6)
    assert torch.equal(cache.k, expected[0]) and torch.equal(cache.v, expected[1])
    chained = torch.tensor([0, 3]), torch.tensor([3, 5])  # row 3 written and read: the gather's to do
    assert not c_attention.copy_rows(cache.k, cache.v, *chained, 6)
    assert torch.equal(cache.k, expected[0])
    with pytest.raises(IndexError):
        c_attention.copy_rows(cache.k, cache.v, torch.tensor([0]), torch.tensor([10]), 6)
    with pytest.raises(IndexError):
        c_attention.copy_rows(cache.k, cache.v, dest, src, 17)
    # KVCache.copy takes either way: filled (N,) bounds the prefix copied, as the gather's
    for c in expected:
        c[:, chained[0], :, :11] = c[:, chained[1], :, :11].clone()
    cache.copy(*chained)
    assert torch.equal(cache.k, expected[0]) and torch.equal(cache.v, expected[1])
