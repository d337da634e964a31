import math

import pytest
import torch

from model.layers import PositionalEncoding, attention, sinusoidal_table, subsequent_mask


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
