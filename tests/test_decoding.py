"""model.decode.decoding.CachedStepper: a reorder copies few cache rows (or, with attention in C, only their
lineage: KVCache) and every search row still sees its own prefix."""

from __future__ import annotations

import pytest
import torch

from model.decode.decoding import CachedStepper
from model.kernels import native
from model.nn.config import ModelConfig
from model.nn.kv_cache import KVCache
from model.nn.transformer import Seq2Seq


@pytest.fixture(autouse=True, params=["c", "torch"])
def attention(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test with decode-step attention in C (a lineage cache) and in PyTorch's ops (keys copied)."""
    if request.param == "c" and not native.built():
        pytest.skip("the C kernels are not built here")
    if request.param == "torch":
        monkeypatch.setattr(native, "_LIB", None)
    return str(request.param)


def stepper(B: int, K: int) -> CachedStepper:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=24,
        d_model=16,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        pad_token_id=23,
        decoder_start_token_id=23,
    )
    model = Seq2Seq(cfg).eval()
    src = torch.randint(0, 23, (B, 5))
    mask = torch.ones(B, 5, dtype=torch.bool)
    return CachedStepper(model, model.encode(src, mask), mask, K, 8)


def mark_rows(st: CachedStepper) -> None:
    """Write each cache row's index into its position-0 keys, to follow rows through reorders."""
    st.cache.length = 1
    st.cache.k[:, :, :, 0] = torch.arange(st.cache.capacity, dtype=torch.float)[None, :, None, None]


def row_marks(st: CachedStepper) -> list[int]:
    """The original row each search row's prefix came from."""
    lineage = st.cache.lineage
    held = st.phys if lineage is None else lineage[st.phys, 0]  # the buffer row holding position 0
    return [int(st.cache.k[0, int(r), 0, 0, 0]) for r in held]


@torch.inference_mode()
def test_first_reorder_expands_each_sentence_to_k_rows_in_its_block(attention: str) -> None:
    st = stepper(B=3, K=4)
    mark_rows(st)
    st.reorder(torch.tensor([0, 1, 2]).repeat_interleave(4), None)
    assert row_marks(st) == [0] * 4 + [1] * 4 + [2] * 4
    if attention == "c":  # a lineage cache keeps rows in search order
        assert st.identity and st.phys.tolist() == list(range(12))
    else:
        assert (
            sorted(st.phys.tolist()) == list(range(12))
            and st.phys.view(3, 4).div(4, rounding_mode="floor").eq(torch.arange(3)[:, None]).all()
        )


@torch.inference_mode()
def test_a_continuing_beam_stays_put_and_only_siblings_move(attention: str) -> None:
    st = stepper(B=2, K=4)
    st.reorder(torch.tensor([0, 1]).repeat_interleave(4), None)
    mark_rows(st)
    before = st.phys.clone()
    # Sentence 0: beams 0, 0, 2, 3 (beam 1 dies, beam 0 has two children); sentence 1 keeps its beams.
    rows = torch.tensor([0, 0, 2, 3, 4, 5, 6, 7])
    copies: list[int] = []
    move = st.cache.move

    def counting(dest: torch.Tensor, src: torch.Tensor) -> None:
        copies.append(int((dest != src).sum()))
        move(dest, src)

    st.cache.move = counting  # type: ignore[method-assign]
    keys = st.cache.k.clone()
    st.reorder(rows, None)
    # PyTorch's attention: the second child of beam 0 is copied into the place beam 1 left; in C no key moves.
    assert copies == ([] if attention == "c" else [1])
    # bits, as unused memory may hold NaNs
    assert attention == "torch" or torch.equal(st.cache.k.view(torch.int32), keys.view(torch.int32))
    assert row_marks(st) == [int(before[r]) for r in rows]


@torch.inference_mode()
def test_a_finished_sentence_is_refilled_by_the_last_block(attention: str) -> None:
    st = stepper(B=3, K=2)
    st.reorder(torch.tensor([0, 1, 2]).repeat_interleave(2), None)
    mark_rows(st)
    before = st.phys.clone()
    cross_k = st.cross.k[0].clone()
    # Sentence 0 finished: sentences 1 and 2 remain, their beams unchanged.
    rows = torch.tensor([2, 3, 4, 5])
    st.reorder(rows, torch.tensor([1, 2]))
    assert row_marks(st) == [int(before[r]) for r in rows]
    if attention == "c":  # rows stay in search order; the source keys stay in their slots, the rows read them there
        assert st.identity and st.phys.tolist() == list(range(4))
        assert torch.equal(st.cross.k[0], cross_k)
        assert st.cross.beams == 2 and st.cross.row_index is not None and st.cross.row_index.tolist() == [2, 3, 4, 5]
        st.reorder(torch.tensor([0, 1]), torch.tensor([0]))  # then sentence 2 finished: sentence 1 reads slot 1
        assert torch.equal(st.cross.k[0], cross_k) and st.cross.row_index.tolist() == [2, 3]
    else:
        assert st.phys.tolist() == [2, 3, 0, 1]  # sentence 1 stays in block 1, sentence 2 fills block 0
        torch.testing.assert_close(st.cross.k[0], cross_k[[2, 1]])  # cross-attention follows the blocks


@torch.inference_mode()
def test_cpu_cross_cache_keeps_its_keys_through_select_extend_trim(attention: str) -> None:
    st = stepper(B=3, K=2)
    cross = st.cross
    assert st.cache.lineage is None if attention == "torch" else st.cache.lineage is not None
    # Sources are padded to layers.attended_keys: at least ceil(NAIVE_BMM_MACS / (2 x D)) = 25 positions,
    # a multiple of 16 (Seq2Seq.cross_cache).
    least = 32
    assert cross.padded and cross.src_mask.shape[-1] == least and bool((~cross.src_mask[..., 5:]).all())
    # PyTorch's batched matmul reads keys (B, H, D, S) faster; the C kernel reads (B, H, S, D).
    assert cross.keys_transposed == (attention == "torch")
    assert cross.keys(0).shape[-2:] == (least, 8)  # d_model 16, 2 heads
    short = st.model.cross_cache(
        st.model.encode(torch.randint(0, 23, (1, 3)), torch.ones(1, 3, dtype=torch.bool)),
        torch.ones(1, 3, dtype=torch.bool),
    )
    long = st.model.cross_cache(
        st.model.encode(torch.randint(0, 23, (1, 40)), torch.ones(1, 40, dtype=torch.bool)),
        torch.ones(1, 40, dtype=torch.bool),
    )
    cross.extend(short)
    cross.extend(long)  # 40 source positions, padded to 48
    assert cross.keys(0).shape == (5, 2, 48, 8)
    torch.testing.assert_close(cross.keys(0)[3, :, :least], short.keys(0)[0])
    assert bool((cross.keys(0)[3, :, least:] == 0).all()) and not cross.src_mask[3, ..., 3:].any()
    cross.select(torch.tensor([3]))  # only the short sentence: trim drops the padding past the least
    cross.trim()
    assert cross.keys(1).shape == (1, 2, least, 8)
    torch.testing.assert_close(cross.keys(1), short.keys(1))


@torch.inference_mode()
def test_a_lineage_cache_moves_rows_as_a_copying_one_does() -> None:
    caches = [KVCache(1, 4, 1, 3, 2, dtype=torch.float32, device=torch.device("cpu"), lineage=c) for c in (True, False)]
    for cache in caches:
        for pos in range(2):  # rows 0-3 write their own index at positions 0 and 1
            marks = torch.arange(4, dtype=torch.float32)[:, None, None, None].expand(4, 1, 1, 2) + 10 * pos
            cache.update(0, pos, marks, marks)
        cache.move(torch.tensor([2, 0, 1]), torch.tensor([3, 3, 0]))  # rows 2, 0, 1 take rows 3, 3, 0
    lineage, copying = caches
    assert lineage.rows == copying.rows == 3
    held = [[float(lineage.k[0, int(lineage.lineage[n, t]), 0, t, 0]) for t in range(2)] for n in range(3)]  # type: ignore[index]
    assert (
        held == [[float(copying.k[0, n, 0, t, 0]) for t in range(2)] for n in range(3)] == [[3, 13], [0, 10], [3, 13]]
    )
