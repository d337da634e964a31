"""The GPU step's Triton kernels (model/kernels/triton_step.py) against the PyTorch operators they replace,
on CPU tensors under Triton's interpreter where there is no GPU (on one, compiled): the step math of
model/decode/slots.py, at shapes that leave partial blocks (a width, a head dimension and a cache length
that are no power of two); and the whole static pool decoding with them (model/plan.py's "triton" set) as
with PyTorch's operators."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are decorated, at their module's import

import torch.nn.functional as F

from model.kernels import triton_step
from model.nn.layers import attention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.triton


def test_the_kernels_run_on_this_machine_s_triton() -> None:
    """Where there is no GPU the interpreter runs them (so these tests check the kernels' own source)."""
    interpreted = type(triton_step._add_layer_norm).__name__ == "InterpretedFunction"
    assert interpreted == (DEVICE == "cpu")


def test_add_layer_norm_is_the_sum_and_f_layer_norm_of_it() -> None:
    g = torch.Generator().manual_seed(0)
    for n, c in ((1, 8), (7, 96), (12, 333)):
        x = (torch.randn(n, c, generator=g) * 3).to(DEVICE)
        r = (torch.randn(n, c, generator=g) + 1).to(DEVICE)
        w, b = torch.randn(c, generator=g).to(DEVICE), torch.randn(c, generator=g).to(DEVICE)
        summed, normed = triton_step.add_layer_norm(x, r, w, b, 1e-5)
        assert torch.equal(summed, x + r)
        torch.testing.assert_close(normed, F.layer_norm(x + r, (c,), w, b, 1e-5), atol=1e-5, rtol=1e-5)


def reference_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pos: torch.Tensor,
    t: int,
) -> torch.Tensor:
    """slots._self_attention's math: the index writes at each row's position, then attention over the mask."""
    rows = torch.arange(q.shape[0], device=q.device)
    k[rows, :, pos] = k_new
    v[rows, :, pos] = v_new
    mask = (torch.arange(t, device=q.device) <= pos[:, None])[:, None, None, :]  # (N, 1, 1, t)
    return attention(q[:, :, None], k[:, :, :t], v[:, :, :t], mask)[:, :, 0]  # (N, H, D)


def test_slot_self_attention_writes_each_row_s_key_and_attends_as_the_step_s_operators() -> None:
    g = torch.Generator().manual_seed(1)
    for n, h, d, t, t_len in ((3, 2, 8, 16, 16), (6, 4, 24, 80, 70), (5, 1, 64, 130, 129)):
        k = torch.randn(n, h, t, d, generator=g).to(DEVICE)
        v = torch.randn(n, h, t, d, generator=g).to(DEVICE)
        q, k_new, v_new = (torch.randn(n, h, d, generator=g).to(DEVICE) for _ in range(3))
        pos = torch.randint(0, t_len, (n,), generator=g).to(DEVICE)
        pos[0] = 0  # a first step attends to its own key alone
        pos[-1] = t_len - 1
        k_ref, v_ref = k.clone(), v.clone()
        want = reference_attention(q, k_new, v_new, k_ref, v_ref, pos, t_len)
        got = triton_step.slot_self_attention(q, k_new, v_new, k, v, pos, t_len)
        assert torch.equal(k, k_ref) and torch.equal(v, v_ref)  # written where the step writes, nothing else
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_row_s_attention_is_the_same_alone_and_beside_others() -> None:
    g = torch.Generator().manual_seed(2)
    n, h, d, t = 4, 2, 16, 40
    k, v = torch.randn(n, h, t, d, generator=g).to(DEVICE), torch.randn(n, h, t, d, generator=g).to(DEVICE)
    q, k_new, v_new = (torch.randn(n, h, d, generator=g).to(DEVICE) for _ in range(3))
    pos = torch.tensor([3, 39, 0, 17], device=DEVICE)
    together = triton_step.slot_self_attention(q, k_new, v_new, k.clone(), v.clone(), pos, t)
    for i in range(n):
        alone = triton_step.slot_self_attention(
            q[i : i + 1],
            k_new[i : i + 1],
            v_new[i : i + 1],
            k[i : i + 1].clone(),
            v[i : i + 1].clone(),
            pos[i : i + 1],
            t,
        )
        assert torch.equal(alone[0], together[i])


def test_slot_cross_attention_attends_each_beam_over_its_slot_s_source_as_the_step_s_operators() -> None:
    """slots._cross_attention's math: a slot's K beams are the queries of one attention over its source."""
    g = torch.Generator().manual_seed(3)
    for s, beams, h, d, p, p_len in ((2, 1, 2, 8, 16, 16), (3, 4, 4, 24, 90, 70), (2, 2, 1, 64, 130, 129)):
        k = torch.randn(s, h, p, d, generator=g).to(DEVICE)
        v = torch.randn(s, h, p, d, generator=g).to(DEVICE)
        q = torch.randn(s * beams, h, d, generator=g).to(DEVICE)
        lengths = torch.randint(1, p_len + 1, (s,), generator=g)
        lengths[0] = 1  # a one-token source
        src_mask = (torch.arange(p)[None, :] < lengths[:, None]).to(DEVICE)  # (S, P)
        queries = q.view(s, beams, h, d).transpose(1, 2)  # (S, H, K, D)
        mask = src_mask[:, None, None, :p_len]
        want = attention(queries, k[:, :, :p_len], v[:, :, :p_len], mask).transpose(1, 2).reshape(s * beams, h, d)
        got = triton_step.slot_cross_attention(q, k, v, src_mask, p_len)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_constrained_log_softmax_is_the_step_s_log_softmax_and_constraints() -> None:
    """search.constrain as decode_step calls it (per-row options, sync=False), n-gram bans off: each row in
    turn starting (a forced first token or none), too early for the end, at its last token, or free; one row
    both starting and at its last token (the forced end wins, as constrain orders them)."""
    from model.decode.search import SearchOptions, constrain

    g = torch.Generator().manual_seed(4)
    for v, forced_eos in ((50, 0), (333, None), (5000, 2)):
        n = 8
        logits = (torch.randn(n, v, generator=g) * 4).to(DEVICE)
        pos = torch.tensor([0, 0, 3, 5, 9, 2, 0, 7], device=DEVICE)
        max_len = torch.tensor([10, 10, 10, 6, 20, 3, 1, 40], device=DEVICE)  # rows 3 and 6: the last token
        min_len = torch.tensor([0, 2, 4, 0, 0, 3, 0, 1], device=DEVICE)  # rows 1, 2, 5: too early for </s>
        first = torch.tensor([7, -1, 7, -1, 3, -1, 9, -1], device=DEVICE)  # rows 0 and 6 forced at pos 0
        opts = SearchOptions(eos_token_id=0, suppressed_token_ids=(1, v - 1), forced_eos_token_id=forced_eos)
        suppressed = torch.zeros(v, dtype=torch.bool, device=DEVICE)
        suppressed[list(opts.suppressed_token_ids)] = True
        want = constrain(
            torch.log_softmax(logits.float(), dim=-1), pos, max_len, opts,
            min_lengths=min_len, first_tokens=first, sync=False,
        )  # fmt: skip
        got, _ = triton_step.constrained_log_softmax(logits, pos, max_len, min_len, first, suppressed, 0, forced_eos)
        assert torch.equal(torch.isinf(got), torch.isinf(want))  # the same tokens ruled out
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_the_log_softmax_reads_a_slot_s_options_for_its_beams_and_gives_each_block_s_greatest() -> None:
    """With beams, row n takes slot n // beams' options: the same answer as those options given per row; the block
    maxima are each CHUNK tokens' greatest log-probability, the last block short."""
    g = torch.Generator().manual_seed(5)
    S, K, v = 3, 4, 70  # 70 tokens: two whole blocks of 32 and a short one
    logits = (torch.randn(S * K, v, generator=g) * 4).to(DEVICE)
    pos, max_len = torch.tensor([0, 4, 2], device=DEVICE), torch.tensor([9, 5, 30], device=DEVICE)
    min_len, first = torch.tensor([0, 0, 5], device=DEVICE), torch.tensor([6, -1, -1], device=DEVICE)
    suppressed = torch.zeros(v, dtype=torch.bool, device=DEVICE)
    suppressed[3] = True
    per_slot, maxima = triton_step.constrained_log_softmax(
        logits, pos, max_len, min_len, first, suppressed, 0, 1, beams=K, block_maxima=True
    )
    per_row = [t.repeat_interleave(K) for t in (pos, max_len, min_len, first)]
    alone, none = triton_step.constrained_log_softmax(logits, *per_row, suppressed, 0, 1)
    assert torch.equal(per_slot, alone) and none is None
    padded = torch.nn.functional.pad(per_slot, (0, 96 - v), value=float("-inf"))
    assert maxima is not None and torch.equal(maxima, padded.view(S * K, 3, 32).amax(-1))


def test_ngram_bans_are_the_search_s_bans_and_the_last_call_s_are_lifted() -> None:
    """Histories of few tokens (n-grams recur), slots of n-gram sizes 0, 2 and 3 at several positions, two calls
    in a row on the same buffers: each time exactly search.ban_repeated_ngrams's bans."""
    from model.decode.search import ban_repeated_ngrams

    g = torch.Generator().manual_seed(9)
    S, K, T, V = 3, 2, 12, 10
    bans = torch.zeros(S * K, V, dtype=torch.bool, device=DEVICE)
    banned = torch.full((S * K, T), -1, dtype=torch.long, device=DEVICE)
    ngram = torch.tensor([0, 2, 3], device=DEVICE)
    for pos in (torch.tensor([7, 9, 11]), torch.tensor([3, 12, 6])):  # the second: a slot at T, as finished ones
        history = torch.randint(0, 4, (S * K, T), generator=g)
        history[torch.arange(T)[None, :] >= pos.repeat_interleave(K)[:, None]] = -1
        want = torch.zeros(S * K, V)
        ban_repeated_ngrams(want, history, pos.repeat_interleave(K), ngram.repeat_interleave(K), 3)
        got = triton_step.ngram_bans(history.to(DEVICE), pos.to(DEVICE), ngram, bans, banned, 3)
        assert torch.equal(got.cpu(), want.isinf()) and want.isinf().any()


def test_embed_is_the_model_s_embedding_times_its_scale_plus_the_position_s_sinusoid() -> None:
    g = torch.Generator().manual_seed(6)
    weight, table = torch.randn(50, 24, generator=g).to(DEVICE), torch.randn(40, 24, generator=g).to(DEVICE)
    tokens = torch.randint(0, 50, (12,), generator=g).to(DEVICE)
    pos = torch.tensor([0, 7, 39], device=DEVICE)  # the last slot's past t_last: clamped, as the step clamps it
    got = triton_step.embed(tokens, pos, weight, table, 4.9, 30)
    assert torch.equal(got, weight[tokens] * 4.9 + table[pos.clamp(max=30).repeat_interleave(4)])


def test_the_self_attention_reads_each_earlier_position_from_the_cache_row_its_lineage_names() -> None:
    """Rows whose histories were reordered (a beam continuing another's): position t of row n from cache row
    lineage[n, t], the new key and value written into row n's own row at its slot's position."""
    g = torch.Generator().manual_seed(7)
    S, K, h, d, t = 2, 3, 2, 16, 24
    N = S * K
    k, v = (torch.randn(N, h, t, d, generator=g).to(DEVICE) for _ in range(2))
    qkv = torch.randn(N, 3 * h * d + 5, generator=g).to(DEVICE)[:, 5:]  # rows of another stride, as a view
    pos = torch.tensor([5, 11], device=DEVICE)
    lineage = torch.stack([torch.randint(s * K, (s + 1) * K, (t,), generator=g) for s in range(S) for _ in range(K)])
    lineage = lineage.to(DEVICE)
    q, k_new, v_new = qkv.view(N, 3, h, d).unbind(1)
    k_ref, v_ref = k.clone(), v.clone()
    rows_pos = pos.repeat_interleave(K)
    history = torch.arange(t, device=DEVICE)
    seen_k = k_ref[lineage, :, history].transpose(1, 2).clone()  # (N, H, t, D): row n's positions by its lineage
    seen_v = v_ref[lineage, :, history].transpose(1, 2).clone()
    want = reference_attention(q, k_new, v_new, seen_k, seen_v, rows_pos, t)
    got = triton_step.lineage_self_attention(qkv, k, v, pos, lineage, t, K)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    rows = torch.arange(N, device=DEVICE)
    k_ref[rows, :, rows_pos], v_ref[rows, :, rows_pos] = k_new, v_new
    assert torch.equal(k, k_ref) and torch.equal(v, v_ref)  # each row's own, at its position, nothing else


def reference_advance(log_probs: torch.Tensor, state: Any, lengths: torch.Tensor, t_len: int, opts: Any) -> None:
    """slots.decode_step's beam step and bookkeeping in PyTorch's operators, the cache's reorder as a lineage."""
    from model.decode.search import beam_step
    from model.kernels import execution

    S, K = state.search.run_scores.shape
    step_at = state.pos.clamp(max=t_len - 1)
    was = state.active.clone()
    src_beam, token, done = beam_step(
        log_probs.view(S, K, -1), state.search, state.pos, state.max_len, opts,
        length_penalty=lengths, early_stopping=state.early_stopping, active=state.active, plan=execution.PYTORCH,
    )  # fmt: skip
    active = state.active
    state.finished.copy_(active & done)
    state.pos.add_(active.long())
    active.logical_and_(~done)
    src = torch.where(active[:, None], src_beam, torch.arange(K, device=DEVICE))
    rows = (torch.arange(S, device=DEVICE)[:, None] * K + src).reshape(-1)
    old = state.lineage.clone()
    for n in range(S * K):
        s = n // K
        if was[s]:
            at = int(step_at[s])
            state.lineage[n, :at] = old[rows[n], :at]
            state.lineage[n, at] = rows[n]
    state.tokens.copy_(torch.where(active[:, None], token, state.tokens.view(S, K)).reshape(-1))


def test_the_beam_step_kernel_is_the_search_s_beam_step_and_the_step_s_bookkeeping() -> None:
    """Twelve steps of random log-probabilities (the end token likely) over slots that finish, stop early, wait
    inactive and reach their length limits, with their own length penalties: every state tensor equal to the
    PyTorch operators' after every step, to the bit."""
    from model.decode.search import NEG, SearchOptions, length_norms
    from model.decode.slots import SlotState
    from model.nn.config import preset
    from model.nn.transformer import Seq2Seq

    g = torch.Generator().manual_seed(8)
    for S, K, v, T in ((5, 4, 70, 16), (3, 2, 33, 9), (2, 5, 200, 12)):
        model = Seq2Seq(preset("tiny", v))
        ours = SlotState.allocate(model, S, K, T, 4, device=torch.device(DEVICE))
        ours.active[:-1] = True  # the last slot waits, free
        ours.max_len.copy_(torch.randint(2, T + 1, (S,), generator=g))
        ours.length_penalty.copy_(torch.tensor([1.0, 0.6, 0.0, 1.2, 0.8][:S]))
        ours.early_stopping.copy_(torch.tensor([False, True, False, True, False][:S]))
        ours.search.run_scores[:, 1:] = NEG  # every beam the start token: expand the first
        theirs = dataclasses.replace(
            ours, **{f.name: getattr(ours, f.name).clone() for f in dataclasses.fields(ours) if f.name != "search"}
        )
        theirs.search = dataclasses.replace(ours.search)
        for name in ("run_scores", "run_tokens", "fin_scores", "fin_tokens", "fin_flags", "improvable"):
            setattr(theirs.search, name, getattr(ours.search, name).clone())
        opts = SearchOptions(beam_size=K, eos_token_id=3)
        ended = 0
        for n in range(12):
            logits = torch.randn(S * K, v, generator=g) * 3
            logits[:, 3] += 1.5
            log_probs = torch.log_softmax(logits, -1).to(DEVICE)
            log_probs[:, 5] = float("-inf")  # a suppressed token
            padded = torch.nn.functional.pad(log_probs, (0, -v % 32), value=float("-inf"))
            maxima = padded.view(S * K, -1, 32).amax(-1)
            lengths = length_norms(ours.pos, torch.float32, ours.length_penalty).view(S)
            t_len = T
            triton_step.slot_beam_step(
                log_probs, maxima, tuple(getattr(ours.search, f) for f in ours.search.FIELDS), ours.pos,
                ours.max_len, lengths, ours.early_stopping, ours.active, ours.finished, ours.tokens, ours.lineage,
                t_len, 3, NEG,
            )  # fmt: skip
            reference_advance(log_probs, theirs, theirs.length_penalty, t_len, opts)
            for name, want in theirs.tensors().items():
                assert torch.equal(ours.tensors()[name], want), (S, K, n, name)
            ended += int(ours.finished.sum())
        assert ended >= S - 1 and bool(ours.search.fin_flags.any())  # every slot that decoded finished


def test_a_wrong_shape_is_refused_before_a_launch() -> None:
    x = torch.zeros(2, 8, device=DEVICE)
    try:
        triton_step.add_layer_norm(x, x, torch.ones(7, device=DEVICE), torch.zeros(7, device=DEVICE), 1e-5)
    except ValueError as exc:
        assert "add_layer_norm" in str(exc)
    else:
        raise AssertionError("a (7,) weight for width 8 was taken")


def test_the_static_step_with_the_triton_kernels_decodes_as_with_pytorch_s_operators() -> None:
    """The whole pool (model/decode/slot_decoder.py) on the shipped en-de, once with slots.TORCH_STEP and once
    with model/plan.py's Triton kernels: the same tokens for every sentence and hypothesis, scores within
    1e-5, with n-gram bans, minimum lengths, several hypotheses and sentences joining while others decode."""
    from model import DecodeOptions, Translator
    from model.decode.slot_decoder import PoolShape, SlotDecoder, decode_all
    from model.plan import step_kernels

    from .conftest import read_lines

    tr = Translator.load("en-de", DEVICE, num_threads=1)
    texts = read_lines("test_2016_flickr.en.gz", 6)
    sources = [tr.encode(t) for t in texts]
    opts = [
        DecodeOptions(
            beam_size=2,
            num_hypotheses=1 + i % 2,
            no_repeat_ngram_size=(0, 2, 3)[i % 3],
            min_decoding_length=(0, 6)[i % 2],
            max_decoding_length=24,
            length_penalty=(1.0, 0.6)[i % 2],
        )
        for i in range(len(sources))
    ]
    shape = PoolShape(slots=3, beams=2, target_len=32, source_len=48)
    triton = step_kernels("triton")
    sets = {"torch": step_kernels("torch"), "fused": triton, "per operator": dataclasses.replace(triton, fused=None)}
    results = {}
    for name, kernels in sets.items():
        decoder = SlotDecoder(tr.model, shape, device=torch.device(DEVICE), kernels=kernels)
        with torch.inference_mode():
            results[name] = decode_all(decoder, sources, opts, join_every=2)
    for name in ("fused", "per operator"):
        for i, (want, got) in enumerate(zip(results["torch"], results[name], strict=True)):
            assert [h.tokens for h in got] == [h.tokens for h in want], (name, i)
            assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-5), (name, i)
    assert all(results["torch"])


def test_the_fused_step_decodes_a_pre_norm_model_as_the_operators_and_a_sentence_alone_as_beside_others() -> None:
    """A pre-norm stack (M2M100's and NLLB's: x + f(LayerNorm(x)), the final norm taken with the last sum),
    ReLU, separate target embeddings and a final logits bias, random weights: the same tokens and scores within
    1e-5 as PyTorch's operators; and with the fused kernels each sentence alone as in the full pool."""
    from model import DecodeOptions
    from model.decode.slot_decoder import PoolShape, SlotDecoder, decode_all
    from model.nn.config import ModelConfig
    from model.nn.transformer import Seq2Seq
    from model.plan import step_kernels

    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=90, decoder_vocab_size=70, d_model=48, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=96,
        max_position_embeddings=64, normalize_before=True, activation="relu", share_embeddings=False,
        tie_embeddings=False, final_logits_bias=True, scale_embedding=True, pad_token_id=1, eos_token_id=2,
        decoder_start_token_id=2,
    )  # fmt: skip
    model = Seq2Seq(cfg).to(DEVICE).eval()
    with torch.no_grad():
        assert model.final_logits_bias is not None
        model.final_logits_bias.normal_()
        for norm in (n for layer in model.decoders for n in (layer.norm1, layer.norm2, layer.norm3)):
            norm.weight.normal_(1.0, 0.2)
            norm.bias.normal_(0.0, 0.2)
    g = torch.Generator().manual_seed(1)
    sources = [[*torch.randint(3, 90, (int(n),), generator=g).tolist(), 2] for n in torch.randint(3, 12, (4,))]
    opts = [DecodeOptions(beam_size=2, num_hypotheses=2, max_decoding_length=10)] * len(sources)
    shape = PoolShape(slots=2, beams=2, target_len=16, source_len=16)
    results = {}
    with torch.inference_mode():
        for name in ("torch", "triton"):
            decoder = SlotDecoder(model, shape, device=torch.device(DEVICE), kernels=step_kernels(name))
            results[name] = decode_all(decoder, sources, opts, join_every=1)
        alone = [
            decode_all(SlotDecoder(model, shape, device=torch.device(DEVICE), kernels=step_kernels("triton")), [s], [o])
            for s, o in zip(sources[:2], opts, strict=False)
        ]
    for i, (want, got) in enumerate(zip(results["torch"], results["triton"], strict=True)):
        assert [h.tokens for h in got] == [h.tokens for h in want], i
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-5), i
    for i, one in enumerate(alone):
        assert [(h.tokens, h.score) for h in one[0]] == [(h.tokens, h.score) for h in results["triton"][i]], i
    assert all(len(r) == 2 for r in results["torch"])


def test_an_unknown_step_kernel_set_is_refused_by_name() -> None:
    from model.plan import step_kernels

    try:
        step_kernels("cuda-magic")
    except ValueError as exc:
        assert "torch, triton" in str(exc)
    else:
        raise AssertionError("an unknown kernel set was taken")


def test_the_plan_names_the_static_step_s_kernels_as_the_setting_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    """BEAMSERVE_STEP_KERNELS chooses the static step's kernels where the model loads (model/plan.py), into its
    execution plan, which the pool takes them from; a set that cannot run here is refused at load, by name."""
    from model import Translator
    from model.plan import STEP_ENV

    assert Translator.load("en-de", DEVICE).step_kernels.name == "torch"  # unset: PyTorch's operators
    monkeypatch.setenv(STEP_ENV, "triton")
    tr = Translator.load("en-de", DEVICE)
    assert tr.step_kernels.name == "triton" and tr.plan.describe()["static_step"] == "triton"
    assert "the static step's kernels triton" in tr.plan.lines()[0]
    monkeypatch.setenv(STEP_ENV, "cuda-magic")
    with pytest.raises(ValueError, match="torch, triton"):
        Translator.load("en-de", DEVICE)
    if DEVICE == "cpu":  # compiled Triton kernels need a GPU; on CPU tensors only the interpreter runs them
        monkeypatch.setenv(STEP_ENV, "triton")
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
            Translator.load("en-de", DEVICE)
