"""Beam search driven by hand-written probability tables: exact tokens and scores."""

import math

import pytest
import torch

from model.decode.search import (
    NEG,
    BeamState,
    Hypothesis,
    SearchOptions,
    beam_search,
    beam_step,
    greedy_search,
    top_candidates,
    top_indices,
)
from model.kernels import c_search, execution, native, ops
from model.kernels.log_softmax import log_softmax_

EOS, A, B, START = 0, 1, 2, 3
# P(next token | prefix); unlisted prefixes use DEFAULT.
TABLE = {
    (): {EOS: 0.05, A: 0.55, B: 0.40},
    (A,): {EOS: 0.5, A: 0.3, B: 0.2},
    (B,): {EOS: 0.1, A: 0.8, B: 0.1},
}
DEFAULT = {EOS: 0.9, A: 0.06, B: 0.04}


class TableStepper:
    """Log-probabilities looked up from TABLE by each row's prefix."""

    def __init__(self, rows: int) -> None:
        self.prefixes: list[tuple[int, ...]] = [() for _ in range(rows)]
        self.rows_seen: list[int] = []
        self.started = False

    def step(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        if self.started:
            self.prefixes = [(*p, int(t)) for p, t in zip(self.prefixes, tokens, strict=True)]
        self.started = True
        self.rows_seen.append(len(self.prefixes))
        out = torch.full((len(self.prefixes), 4), -1e4)
        for r, prefix in enumerate(self.prefixes):
            for tok, p in TABLE.get(prefix, DEFAULT).items():
                out[r, tok] = math.log(p)
        return out

    def reorder(self, rows: torch.Tensor, sentences: torch.Tensor | None) -> None:
        self.prefixes = [self.prefixes[int(r)] for r in rows]


def opts(**kw: object) -> SearchOptions:
    return SearchOptions(eos_token_id=EOS, start_token_id=START, suppressed_token_ids=(START,), **kw)  # type: ignore[arg-type]


def run_beam(K: int, n: int, lp: float, max_len: int = 10) -> list[Hypothesis]:
    options = opts(beam_size=K, num_hypotheses=n, length_penalty=lp)
    return beam_search(TableStepper(1), torch.tensor([max_len]), options)[0]


def test_beam_finds_the_better_sequence_greedy_misses() -> None:
    hyps = run_beam(K=2, n=2, lp=1.0)
    assert [h.tokens for h in hyps] == [[B, A], [A, A]]
    assert hyps[0].score == pytest.approx(math.log(0.4 * 0.8 * 0.9) / 3, abs=1e-5)
    assert hyps[1].score == pytest.approx(math.log(0.55 * 0.3 * 0.9) / 3, abs=1e-5)


def test_length_penalty_zero_ranks_by_raw_log_probability() -> None:
    hyps = run_beam(K=2, n=2, lp=0.0)
    assert [h.tokens for h in hyps] == [[B, A], [A]]
    assert hyps[0].score == pytest.approx(math.log(0.288), abs=1e-5)
    assert hyps[1].score == pytest.approx(math.log(0.275), abs=1e-5)


def test_greedy_takes_the_locally_best_token() -> None:
    hyps = greedy_search(TableStepper(1), torch.tensor([10]), opts(beam_size=1))[0]
    assert hyps[0].tokens == [A]
    assert hyps[0].score == pytest.approx(math.log(0.55 * 0.5) / 2, abs=1e-5)


def test_max_length_forces_eos_as_last_token() -> None:
    hyps = run_beam(K=2, n=1, lp=1.0, max_len=1)
    # With forced </s> off, the length cap ends hypotheses without </s>: [A] scores log(.55).
    assert hyps[0].tokens == [A] and hyps[0].score == pytest.approx(math.log(0.55), abs=1e-5)
    forced = beam_search(TableStepper(1), torch.tensor([1]), opts(beam_size=2, forced_eos_token_id=EOS))[0]
    # As in Hugging Face's ForcedEOSTokenLogitsProcessor, the forced </s> adds log-probability 0.
    assert forced[0].tokens == [] and forced[0].score == 0.0


def test_min_decoding_length_blocks_early_eos() -> None:
    hyps = beam_search(TableStepper(1), torch.tensor([10]), opts(beam_size=2, min_decoding_length=3))[0]
    assert len(hyps[0].tokens) >= 3


def test_finished_sentences_leave_the_batch() -> None:
    # Step 0 decodes one row per sentence (the beams are still identical). Sentence 0 may decode 10
    # tokens, sentence 1 only 1: after step 0 only sentence 0's two beams remain.
    stepper = TableStepper(2)
    beam_search(stepper, torch.tensor([10, 1]), opts(beam_size=2))
    assert stepper.rows_seen[0] == 2 and all(r == 2 for r in stepper.rows_seen[1:])


@pytest.mark.parametrize(("V", "chunk"), [(8000, 32), (1000, 64), (301, 32), (97, 32)])
def test_blockwise_candidate_ranking_equals_plain_topk(V: int, chunk: int) -> None:
    """The CPU ranking by vocabulary blocks returns the plain ranking's candidates: every beam, a
    ragged last block, -inf tokens (suppressed) and NEG beams (not yet expanded) included."""
    torch.manual_seed(V)
    b, K = 16, 4
    log_probs = torch.log_softmax(torch.randn(b, K, V) * 4, dim=-1)
    log_probs[:, :, V // 3] = float("-inf")  # a suppressed token
    log_probs[0, :, 1:] = float("-inf")  # a sentence forced to end: one finite token a beam
    run_scores = torch.randn(b, K) * 3
    run_scores[1, 1:] = NEG
    plain = top_candidates(log_probs, run_scores, 2 * K)
    blocks = top_candidates(log_probs, run_scores, 2 * K, chunk=chunk)
    assert torch.equal(plain[0], blocks[0])
    for (s1, b1, t1), (_, b2, t2) in zip(zip(*plain, strict=True), zip(*blocks, strict=True), strict=True):
        finite = s1.isfinite()  # -inf candidates are equally bad: any token may stand for them
        assert torch.equal(b1[finite], b2[finite]) and torch.equal(t1[finite], t2[finite])
    picked = run_scores.gather(1, blocks[1]) + log_probs[torch.arange(b)[:, None], blocks[1], blocks[2]]
    assert torch.equal(picked, blocks[0])


@pytest.mark.parametrize("chunk", [None, 32])
def test_equal_scores_rank_by_beam_then_token_id(chunk: int | None) -> None:
    """Low-precision logits tie often (bfloat16 keeps 8 bits): candidates of equal score come out lowest
    beam, then lowest token id, first, in the plain and the blockwise ranking alike."""
    b, K, V = 3, 4, 1000
    log_probs = torch.full((b, K, V), -20.0)
    run_scores = torch.zeros(b, K)
    for beam, token in [(3, 5), (2, 900), (1, 40), (1, 39), (0, 999), (2, 7)]:  # six ties at the top
        log_probs[:, beam, token] = -1.0
    log_probs[:, 0, 300] = -0.5  # one better than all of them
    scores, beams, tokens = top_candidates(log_probs, run_scores, 5, chunk=chunk)
    assert scores.tolist() == [[-0.5, -1.0, -1.0, -1.0, -1.0]] * b
    ranked = list(zip(beams[0].tolist(), tokens[0].tolist(), strict=True))
    assert ranked == [(0, 300), (0, 999), (1, 39), (1, 40), (2, 7)]
    assert torch.equal(beams, beams[:1].expand(b, -1)) and torch.equal(tokens, tokens[:1].expand(b, -1))


def test_top_indices_orders_signed_zeros_infinities_and_ties() -> None:
    scores = torch.tensor([[-0.0, 0.0, float("-inf"), 1.0, -3.5, 1.0, float("inf"), -1e-30, 2.5e-38]])
    assert top_indices(scores, 9).tolist() == [[6, 3, 5, 8, 0, 1, 7, 4, 2]]
    assert top_indices(scores, 3, order=torch.tensor([[0, 1, 2, 3, 4, 2, 5, 6, 7]])).tolist() == [[6, 5, 3]]


def test_one_beam_picks_greedy_searchs_token_among_equal_scores() -> None:
    """Beam search with one beam takes the token greedy's argmax does when the best scores tie."""

    class Tied:
        def step(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
            out = torch.full((tokens.numel(), 64), -30.0)
            out[:, [50, 9, 33]] = 2.0  # three equally likely tokens
            out[:, EOS] = 2.0 if pos >= 2 else -30.0
            return out

        def reorder(self, rows: torch.Tensor, sentences: torch.Tensor | None) -> None:
            pass

    greedy = greedy_search(Tied(), torch.tensor([8]), opts(beam_size=1))[0][0]
    beam = beam_search(Tied(), torch.tensor([8]), opts(beam_size=1))[0][0]
    assert greedy.tokens == beam.tokens == [9, 9] and greedy.score == beam.score


@pytest.mark.parametrize("vocab", [7, 8000])
@pytest.mark.parametrize("kernels", ["c", "torch"])
def test_log_softmax_over_the_logits_gives_the_same_values_to_the_bit(
    vocab: int, kernels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written over contiguous logits, the values a new tensor would get: ATen's, or with the C kernels
    built, theirs (model/kernels/native.py)."""
    if kernels == "c" and not native.built():
        pytest.skip("the C kernels are not built here")
    if kernels == "torch":
        monkeypatch.setattr(native, "_LIB", None)
    torch.manual_seed(0)
    logits = torch.randn(40, vocab) * 5
    want = native.log_softmax_(logits.clone()) if kernels == "c" else torch.log_softmax(logits, dim=-1)
    assert torch.equal(log_softmax_(logits.clone()), want)  # contiguous: written over the logits
    view = torch.randn(40, 2 * vocab)[:, :vocab]  # not contiguous: a new tensor (ATen's), the source untouched
    before = view.clone()
    assert torch.equal(log_softmax_(view), torch.log_softmax(before, dim=-1))
    assert torch.equal(view, before)


def test_ban_repeated_ngrams_bans_exactly_the_tokens_that_would_repeat_an_ngram() -> None:
    from model.decode.search import ban_repeated_ngrams

    history = torch.tensor([[5, 6, 5, 7, 5, -1], [5, 6, 5, 6, 9, 9], [1, 2, 1, 2, 1, 2]])  # (3, 6)
    pos = torch.tensor([5, 3, 6])  # tokens generated by each row; later positions are ignored
    lp = torch.zeros(3, 10)
    ban_repeated_ngrams(lp, history, pos, 2)
    banned = [sorted((lp[r] == float("-inf")).nonzero()[:, 0].tolist()) for r in range(3)]
    # row 0 ends in 5, after which came 6 and 7; row 1 ends in 5 (its 6 at position 3 is not generated yet),
    # after which came 6; row 2 ends in 2, after which came 1.
    assert banned == [[6, 7], [6], [1]]
    lp = torch.zeros(3, 10)
    ban_repeated_ngrams(lp, history, pos, 3)
    banned = [sorted((lp[r] == float("-inf")).nonzero()[:, 0].tolist()) for r in range(3)]
    assert banned == [[], [], [1]]  # only row 2's last two tokens (1, 2) were followed before (by 1)
    lp = torch.zeros(1, 10)
    ban_repeated_ngrams(lp, history[:1], 5, 1)  # unigrams: every token generated so far
    assert sorted((lp[0] == float("-inf")).nonzero()[:, 0].tolist()) == [5, 6, 7]


def _beam_steps(
    seed: int, shape: tuple[int, int, int, int], opts: SearchOptions, plan: execution.Plan
) -> list[list[torch.Tensor]]:
    """Twelve beam steps over random log-probabilities (the end token likely): each step's answer and state, by
    the kernels of `plan`."""
    b, K, V, T = shape
    g = torch.Generator().manual_seed(seed)
    state = BeamState.start(b, K, T, torch.device("cpu"))
    max_lengths = torch.randint(2, T + 1, (b,), generator=g)
    steps = []
    for n in range(12):
        log_probs = torch.log_softmax(torch.randn(b, K, V, generator=g) * 3, -1)
        log_probs[:, :, opts.eos_token_id] += 1.5
        answer = beam_step(log_probs, state, torch.full((b,), n), max_lengths, opts, plan=plan)
        steps.append([*answer, *(getattr(state, f).clone() for f in BeamState.FIELDS)])
    return steps


@pytest.mark.skipif(not native.built(), reason="the C kernels are not built, or turned off")
@pytest.mark.parametrize("shape", [(1, 4, 50, 8), (3, 4, 20, 6), (5, 2, 30, 5), (2, 1, 10, 4), (4, 5, 40, 10)])
@pytest.mark.parametrize(("early_stopping", "length_penalty"), [(False, 1.0), (True, 0.6), (False, 0.0)])
def test_the_beam_step_in_c_gives_the_same_answer_and_state_as_pytorchs_ops(
    shape: tuple[int, int, int, int], early_stopping: bool, length_penalty: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    opts = SearchOptions(
        beam_size=shape[1], eos_token_id=3, early_stopping=early_stopping, length_penalty=length_penalty
    )
    calls: list[int] = []
    step = ops.beam_step
    monkeypatch.setattr(ops, "beam_step", lambda *a: calls.append(1) or step(*a))
    for seed in range(8):  # sentences finishing, finished hypotheses replaced, sentences done and stepped on
        in_c = _beam_steps(seed, shape, opts, execution.probe())
        assert calls, "the C beam step did not run"
        calls.clear()
        in_torch = _beam_steps(seed, shape, opts, execution.PYTORCH)
        assert not calls
        for n, (ours, theirs) in enumerate(zip(in_c, in_torch, strict=True)):
            for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
                assert torch.equal(a, b), (seed, n, i)


class RandomStepper:
    """Seeded log-probabilities over V tokens, the end token likely: the same values for the same calls."""

    def __init__(self, seed: int, V: int) -> None:
        self.g = torch.Generator().manual_seed(seed)
        self.V = V
        self.rows: list[int] = []

    def step(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        self.rows.append(tokens.numel())
        logits = torch.randn(tokens.numel(), self.V, generator=self.g) * 3
        logits[:, 3] += 2.0
        return torch.log_softmax(logits, -1)

    def reorder(self, rows: torch.Tensor, sentences: torch.Tensor | None) -> None:
        pass


@pytest.mark.skipif(not native.built(), reason="the C kernels are not built, or turned off")
@pytest.mark.parametrize(
    "rules",
    [
        {},
        {"suppressed_token_ids": (5, 0), "min_decoding_length": 3},
        {"forced_eos_token_id": 3, "forced_bos_token_id": 7, "early_stopping": True, "length_penalty": 0.6},
        {"num_hypotheses": 3, "length_penalty": 0.0, "min_decoding_length": 1, "suppressed_token_ids": (9,)},
    ],
)
def test_a_beam_step_as_one_c_call_gives_the_searchs_answer_in_pytorchs_ops(
    rules: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    options = SearchOptions(beam_size=4, eos_token_id=3, start_token_id=1, **rules)  # type: ignore[arg-type]
    max_lengths = torch.tensor([9, 3, 12, 6, 1])  # sentences finish at different steps, one at its first
    calls: list[int] = []
    advance = c_search.BeamAdvance.__call__
    monkeypatch.setattr(c_search.BeamAdvance, "__call__", lambda *a: calls.append(1) or advance(*a))
    for seed in range(6):
        in_c = beam_search(RandomStepper(seed, 40), max_lengths, options)
        stepper = RandomStepper(seed, 40)
        in_torch = beam_search(stepper, max_lengths, options, execution.PYTORCH)
        assert in_c == in_torch, seed
        assert stepper.rows[:2] == [5, 16]  # one row per sentence, then K; the one of length 1 done at once
    assert calls, "the C step did not run"


@pytest.mark.skipif(not native.built(), reason="the C kernels are not built, or turned off")
def test_a_rule_naming_a_token_outside_the_vocabulary_is_refused_in_c_as_in_pytorch() -> None:
    options = SearchOptions(beam_size=2, eos_token_id=3, suppressed_token_ids=(40,))
    with pytest.raises(IndexError):
        beam_search(RandomStepper(0, 40), torch.tensor([4]), options)
