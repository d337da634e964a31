import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from model.kernels.quant import use_int8
from model.nn.layers import (
    MultiHeadAttention,
    PositionalEncoding,
    attention,
    sinusoidal_table,
    softmax_,
    step_attention,
    subsequent_mask,
)


def test_attention_is_softmax_of_scaled_dot_products() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)
    mask = torch.rand(2, 1, 1, 7) > 0.3
    mask[..., 0] = True
    scores = q @ k.transpose(-1, -2) / math.sqrt(8)
    expected = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v
    torch.testing.assert_close(attention(q, k, v, mask), expected, atol=1e-5, rtol=1e-5)


def test_causal_attention_matches_subsequent_mask() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
    torch.testing.assert_close(attention(q, k, v, causal=True), attention(q, k, v, subsequent_mask(6)))
    assert subsequent_mask(3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]


@pytest.mark.parametrize("dim", [8, 9])
def test_sinusoids_follow_the_paper_with_marian_layout(dim: int) -> None:
    table = sinusoidal_table(20, dim)
    half = (dim + 1) // 2
    for pos in (0, 3, 19):
        for i in range(half):
            angle = pos / 10000 ** (2 * i / dim)
            assert table[pos, i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            if i < dim // 2:
                assert table[pos, half + i].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_positional_encoding_is_not_saved_in_checkpoints() -> None:
    assert "table" not in PositionalEncoding(10, 4).state_dict()


@pytest.mark.parametrize("T", [1, 3, 6, 7, 16])
def test_decode_step_attention_equals_sdpa_on_both_sides_of_the_tiny_matmul_path(T: int) -> None:
    # Up to 6 cached positions x 64 the decode path multiplies by broadcasting (layers.NAIVE_BMM_MACS).
    torch.manual_seed(T)
    q, k, v = torch.randn(5, 4, 1, 64), torch.randn(5, 4, T, 64), torch.randn(5, 4, T, 64)
    mask = torch.rand(5, 1, 1, T) > 0.3
    mask[..., 0] = True
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(attention(q, k, v, mask), expected, atol=1e-5, rtol=1e-5)
    # The same keys read through a transposed view (CrossCache's CPU layout).
    k_t = k.transpose(-1, -2).contiguous().transpose(-1, -2)
    torch.testing.assert_close(attention(q, k_t, v, mask), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("width", [1, 5, 15, 16, 17, 40])
def test_softmax_matches_aten(width: int) -> None:
    torch.manual_seed(width)
    scores = torch.randn(64, 4, 4, width) * 4
    scores[..., 1:] = scores[..., 1:].masked_fill(torch.rand(64, 1, 1, width - 1) > 0.6, float("-inf"))
    expected = torch.softmax(scores, dim=-1)
    got = softmax_(scores.clone())
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    assert bool((got[scores == float("-inf")] == 0).all())


@pytest.mark.parametrize("width", [1, 7, 15, 16, 33])
def test_softmax_of_a_row_is_the_same_bits_whatever_masked_padding_follows_it(width: int) -> None:
    torch.manual_seed(width)
    scores = torch.randn(8, 4, 4, width) * 4
    alone = softmax_(scores.clone())
    for pad in (1, 9, 16, 40):
        padded = torch.cat([scores, torch.full((8, 4, 4, pad), float("-inf"))], dim=-1)
        assert torch.equal(softmax_(padded)[..., :width], alone), pad


def test_softmax_keeps_autograd_working_on_narrow_rows() -> None:
    # Training's cross-attention of short targets takes the decode path; in-place passes would break backward.
    scores = torch.randn(2, 3, 5, requires_grad=True)
    softmax_(scores * 1.0)[..., 0].sum().backward()
    expected = torch.func.grad(lambda s: torch.softmax(s, -1)[..., 0].sum())(scores.detach())
    torch.testing.assert_close(scores.grad, expected)


@pytest.mark.parametrize(("queries", "keys"), [(1, 1), (1, 3), (1, 12), (4, 2), (4, 20)])
def test_step_attention_gives_a_row_the_same_bits_however_its_batch_pads_it(queries: int, keys: int) -> None:
    # Rows at their own positions (continuous batching): a row alone over its own keys, and beside rows
    # with more keys, its own then masked.
    torch.manual_seed(queries * 100 + keys)
    q, k, v = torch.randn(1, 4, queries, 64), torch.randn(1, 4, keys, 64), torch.randn(1, 4, keys, 64)
    alone = step_attention(q, k, v, None)
    torch.testing.assert_close(alone, attention(q, k, v), atol=1e-5, rtol=1e-5)
    for longest in (keys + 1, keys + 7, 40):
        others = [torch.randn(5, 4, n, 64) for n in (queries, longest, longest)]
        qb = torch.cat([q, others[0]])
        kb = torch.cat([F.pad(k, (0, 0, 0, longest - keys)), others[1]])
        vb = torch.cat([F.pad(v, (0, 0, 0, longest - keys)), others[2]])
        mask = (torch.arange(longest) < torch.tensor([keys, *[longest] * 5])[:, None])[:, None, None, :]
        assert torch.equal(step_attention(qb, kb, vb, mask)[:1], alone), longest


@pytest.mark.parametrize(("beams", "keys"), [(1, 3), (2, 9), (4, 13), (5, 20)])
def test_cross_step_attention_gives_a_sentence_the_same_bits_beside_more_beams_and_longer_sources(
    beams: int, keys: int
) -> None:
    # Continuous batching: a sentence's beams are query rows, as many as the batch's widest search (the
    # rest zeros), over the batch's longest source (the rest masked).
    torch.manual_seed(beams * 100 + keys)
    q, k, v = torch.randn(1, 4, beams, 64), torch.randn(1, 4, keys, 64), torch.randn(1, 4, keys, 64)
    alone = step_attention(q, k, v, None, cross=True)
    torch.testing.assert_close(alone, attention(q, k, v), atol=1e-5, rtol=1e-5)
    for widest, longest in ((beams, keys + 1), (5, keys + 6), (8, 41)):
        qb = torch.cat([F.pad(q, (0, 0, 0, widest - beams)), torch.randn(3, 4, widest, 64)])
        kb = torch.cat([F.pad(k, (0, 0, 0, longest - keys)), torch.randn(3, 4, longest, 64)])
        vb = torch.cat([F.pad(v, (0, 0, 0, longest - keys)), torch.randn(3, 4, longest, 64)])
        mask = (torch.arange(longest) < torch.tensor([keys, longest, longest, longest])[:, None])[:, None, None, :]
        assert torch.equal(step_attention(qb, kb, vb, mask, cross=True)[:1, :, :beams], alone), (widest, longest)


MKL_AVX2 = """
import torch
import torch.nn.functional as F
from model.nn.layers import step_attention

torch.manual_seed(0)
for beams in (1, 4, 8):
    for keys in range(1, 41):
        q, k, v = torch.randn(1, 4, beams, 64), torch.randn(1, 4, keys, 64), torch.randn(1, 4, keys, 64)
        alone = step_attention(q, k, v, None, cross=True)
        for longest in (keys + 3, keys + 9, 48):
            kb = torch.cat([F.pad(k, (0, 0, 0, longest - keys)), torch.randn(3, 4, longest, 64)])
            vb = torch.cat([F.pad(v, (0, 0, 0, longest - keys)), torch.randn(3, 4, longest, 64)])
            qb = torch.cat([q, torch.randn(3, 4, beams, 64)])
            mask = (torch.arange(longest) < torch.tensor([keys, longest, longest, longest])[:, None])[:, None, None, :]
            assert torch.equal(step_attention(qb, kb, vb, mask, cross=True)[:1], alone), (beams, keys, longest)
print("padding-blind")
"""


def test_step_attention_is_padding_blind_in_mkls_avx2_kernels_too() -> None:
    # MKL picks its batched GEMM's kernels by the CPU: without AVX-512 (or held to AVX2, as here) 4 or 8 query rows
    # against 4 or 8 keys past a multiple of 16 took another kernel than against more keys (layers.KEY_MULTIPLE)
    env = {**os.environ, "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    out = subprocess.run([sys.executable, "-c", MKL_AVX2], env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "padding-blind", out.stderr[-3000:]


@torch.inference_mode()
@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_q_k_v_as_one_gemm_give_the_three_projections_bits(bias: bool, int8: bool) -> None:
    torch.manual_seed(0)
    attn = MultiHeadAttention(64, 4).eval()
    x = torch.randn(37, 64) * 3
    if not bias:
        for p in (attn.q_proj, attn.k_proj, attn.v_proj):
            p.bias = None
    if int8:
        for p in (attn.q_proj, attn.k_proj, attn.v_proj):
            use_int8(p, p.weight)
    for rows in (37, 4, 1):  # the GEMM of 192 columns sums each row as the three of 64 do, at any row count
        qkv = attn.project_qkv(x[:rows])
        assert qkv.shape == (rows, 3 * 64)
        for ours, p in zip(qkv.split(64, dim=1), (attn.q_proj, attn.k_proj, attn.v_proj), strict=True):
            assert torch.equal(ours, p(x[:rows])), rows
    attn.k_proj.weight.data.mul_(2)  # a changed weight: the fused one follows (its version counter moved)
    if not int8:
        assert torch.equal(attn.project_qkv(x)[:, 64:128], attn.k_proj(x))
