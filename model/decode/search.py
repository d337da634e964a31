"""Greedy and beam search over log-probabilities, independent of the network that produces them.

The loops talk to a `Stepper` (the model plus its caches) through two calls: `step` returns logits
for every live hypothesis row, `reorder` keeps the chosen rows. Sentences leave the batch the step
they finish, so no compute is spent on them afterwards.

Beam search reproduces Hugging Face `generate(num_beams=K)` exactly (its vectorised beam search):
2K candidates per sentence so finished hypotheses never starve the beam, only the top K of them may
finish, scores normalised as sum(log p) / length ** length_penalty where length counts the generated
tokens including </s>, and HF's `early_stopping=False` stopping heuristic.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from model.kernels import c_search, execution, ops

NEG = -1.0e9  # "impossible" without the NaNs that -inf arithmetic can produce
CHUNK = 32  # vocabulary block of the CPU candidate ranking (top_candidates); 32-64 were best on 8,000 ids


class Stepper(Protocol):
    """The first step has one row per sentence (every beam is still the start token alone); the first
    reorder gives each sentence its K rows, later ones keep K rows per live sentence."""

    def step(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        """tokens (N,) at position pos -> float32 log-probabilities (N, V) for position pos + 1, as
        log_softmax_ gives them."""
        ...

    def reorder(self, rows: torch.Tensor, sentences: torch.Tensor | None) -> None:
        """Keep hypothesis rows `rows` (N',) and, when given, only the sentences `sentences` (B',)."""
        ...


class BeamSteps(Protocol):
    """A stepper's steps from pos (>= 1) while every sentence goes on, each the step, then `advance` with the step's
    norms[i], then the reorder to the rows it gives, in one call (decoding.CachedStepper.beam_steps): returns the steps
    taken, the last one's `advance` answer and log-probabilities, tokens replaced by the next step's where the
    steps went on; None where it does not run (nothing computed)."""

    def __call__(
        self, tokens: torch.Tensor, pos: int, advance: c_search.BeamAdvance, norms: torch.Tensor
    ) -> tuple[int, c_search.BeamStep, torch.Tensor] | None: ...


@dataclass(frozen=True)
class SearchOptions:
    beam_size: int = 4
    num_hypotheses: int = 1
    length_penalty: float = 1.0
    min_decoding_length: int = 0
    early_stopping: bool = False  # stop a sentence once it has beam_size finished hypotheses
    eos_token_id: int = 0
    start_token_id: int = 0
    suppressed_token_ids: tuple[int, ...] = ()  # never generated (the padding token)
    forced_eos_token_id: int | None = None  # forced as the last token a sentence may have
    forced_bos_token_id: int | None = None  # forced as the first generated token (a multilingual target)
    no_repeat_ngram_size: int = 0  # > 0: a hypothesis never holds the same n-gram of this size twice


@dataclass(frozen=True)
class Hypothesis:
    tokens: list[int]  # generated ids, </s> excluded
    score: float  # sum of log-probabilities / length ** length_penalty


def constrain(
    log_probs: torch.Tensor,
    pos: int | torch.Tensor,
    max_lengths: torch.Tensor,
    opts: SearchOptions,
    history: torch.Tensor | None = None,
    *,
    min_lengths: torch.Tensor | None = None,
    ngram_sizes: torch.Tensor | None = None,
    first_tokens: torch.Tensor | None = None,
    sync: bool = True,
) -> torch.Tensor:
    """Apply the decoding constraints to log_probs (N, V) of generating token number pos + 1, in place.

    pos is the tokens generated so far, one int for all rows or (N,) per row; max_lengths (N,) is
    each row's limit on generated tokens (</s> included); history (N, T), each row's generated tokens
    (positions from pos on are ignored), is needed for no_repeat_ngram_size. min_lengths and
    ngram_sizes (N,) give each row its own min_decoding_length and no_repeat_ngram_size (at most
    opts.no_repeat_ngram_size), first_tokens (N,) its own forced_bos_token_id (-1: none). sync=False:
    nothing waits on the device (a step captured as a CUDA graph); the same values, at the cost of a
    pass over log_probs every step.
    """
    n_max = opts.no_repeat_ngram_size
    if n_max and history is not None:
        ban_repeated_ngrams(log_probs, history, pos, n_max if ngram_sizes is None else ngram_sizes, n_max)
    for t in opts.suppressed_token_ids:
        log_probs[:, t] = float("-inf")
    eos = opts.eos_token_id
    min_len = opts.min_decoding_length if min_lengths is None else min_lengths
    if isinstance(pos, int) and isinstance(min_len, int):
        if pos < min_len:
            log_probs[:, eos] = float("-inf")
    elif not isinstance(min_len, int) or min_len:
        too_early = torch.as_tensor(pos < min_len, device=log_probs.device).expand(log_probs.shape[0])  # (N,)
        log_probs[:, eos] = log_probs[:, eos].masked_fill(too_early, float("-inf"))
    _force_first(log_probs, pos, opts.forced_bos_token_id, first_tokens)
    if opts.forced_eos_token_id is not None:
        last = max_lengths == pos + 1  # (N,) rows whose next token is their last
        if not sync:
            forced = torch.full_like(log_probs[:1], float("-inf"))  # (1, V)
            # fill_, not item assignment: assigning one element copies a host scalar, which a graph's capture refuses
            forced[:, opts.forced_eos_token_id].fill_(0.0)
            log_probs.copy_(torch.where(last[:, None], forced, log_probs))
        elif bool(last.any()):
            log_probs[last] = float("-inf")
            log_probs[last, opts.forced_eos_token_id] = 0.0
    return log_probs


def _force_first(
    log_probs: torch.Tensor, pos: int | torch.Tensor, token: int | None, per_row: torch.Tensor | None
) -> None:
    """The first generated token forced, as Hugging Face's ForcedBOSTokenLogitsProcessor does: every other
    token -inf, the forced one log-probability 0 (it adds nothing to the score, and counts in the length).
    token: one for all rows; per_row (N,): each row's, -1 for none, applied without waiting on the device."""
    if per_row is None:
        if token is None:
            return
        if isinstance(pos, int):
            if pos == 0:
                log_probs.fill_(float("-inf"))
                log_probs[:, token] = 0.0
            return
        starting = pos == 0  # (N,)
        if bool(starting.any()):
            log_probs[starting] = float("-inf")
            log_probs[starting, token] = 0.0
        return
    first = torch.as_tensor(pos == 0, device=log_probs.device).expand(log_probs.shape[0]) & (per_row >= 0)  # (N,)
    at = per_row.clamp(min=0)[:, None]  # (N, 1)
    kept = log_probs.gather(1, at)
    log_probs.masked_fill_(first[:, None], float("-inf"))
    log_probs.scatter_(1, at, torch.where(first[:, None], torch.zeros_like(kept), kept))


def ban_repeated_ngrams(
    log_probs: torch.Tensor,
    history: torch.Tensor,
    pos: int | torch.Tensor,
    n: int | torch.Tensor,
    n_max: int | None = None,
) -> None:
    """Set to -inf, in place, every token that would complete an n-gram its row has already generated.

    log_probs (N, V); history (N, T) generated tokens, row r's first pos[r] real; pos an int or (N,);
    n the n-gram size, one for all rows or (N,) per row (0: none), at most n_max (n's value if one).
    Hugging Face's NoRepeatNGramLogitsProcessor and CTranslate2's no_repeat_ngram_size: the same bans
    (HF also counts the decoder start token, which never recurs, so no n-gram holding it can match).
    """
    if isinstance(n, int):
        if isinstance(pos, int) and pos < n:
            return  # no whole n-gram generated yet
        n_max = n
    elif n_max is None:
        raise ValueError("n-gram sizes per row need their bound, n_max")
    N, T = history.shape
    dev = history.device
    pos_t = torch.as_tensor(pos, device=dev).expand(N)  # (N,)
    n_t = torch.as_tensor(n, device=dev).expand(N)  # (N,)
    hist = F.pad(history, (0, n_max), value=-2)  # (N, T + n_max): windows may run past T
    windows = hist.unfold(1, n_max, 1)[:, :T]  # (N, T, n_max): tokens j .. j + n_max - 1
    # An earlier n-gram whose first n - 1 tokens are the row's last n - 1 bans its last token.
    w = torch.arange(n_max - 1, device=dev)  # (n_max - 1,)
    tail = hist.gather(1, (pos_t[:, None] - (n_t[:, None] - 1) + w).clamp(min=0))  # (N, n_max - 1)
    compared = w < (n_t[:, None] - 1)  # (N, n_max - 1) the prefix places that count for the row
    same = (windows[:, :, : n_max - 1] == tail[:, None, :]) | ~compared[:, None, :]  # (N, T, n_max - 1)
    starts = torch.arange(T, device=dev)  # (T,) where each earlier n-gram starts
    match = same.all(-1) & (starts <= pos_t[:, None] - n_t[:, None]) & (n_t[:, None] > 0)  # (N, T) wholly generated
    # The last token of the n-gram starting at j: hist[j + n - 1], a 2-d gather (a 3-d gather of the unfolded
    # windows, inside the compiled decode step, is read out of bounds by torch 2.13 inductor's AVX2 code).
    banned = hist.gather(1, starts + (n_t[:, None] - 1).clamp(min=0))  # (N, T)
    # min(x, -inf) bans a token, min(x, +inf) leaves it: touches (N, T) entries, not all (N, V).
    bans = torch.full(match.shape, float("inf"), dtype=log_probs.dtype, device=log_probs.device)
    log_probs.scatter_reduce_(1, banned.clamp(min=0), bans.masked_fill_(match, float("-inf")), reduce="amin")


def greedy_search(stepper: Stepper, max_lengths: torch.Tensor, opts: SearchOptions) -> list[list[Hypothesis]]:
    """Arg-max decoding of B sentences; max_lengths (B,) caps each one's generated tokens."""
    B = max_lengths.numel()
    device = max_lengths.device
    alive = torch.arange(B, device=device)  # original index of each live row
    tokens = torch.full((B,), opts.start_token_id, dtype=torch.long, device=device)
    history = torch.empty(B, 0, dtype=torch.long, device=device)  # (b, n)
    scores = torch.zeros(B, device=device)
    results: list[list[Hypothesis]] = [[] for _ in range(B)]
    for n in range(int(max_lengths.max())):
        log_probs = stepper.step(tokens, n)  # (b, V)
        log_probs = constrain(log_probs, n, max_lengths[alive], opts, history)
        tokens = log_probs.argmax(-1)  # (b,)
        scores = scores + log_probs.gather(1, tokens[:, None])[:, 0]
        history = torch.cat([history, tokens[:, None]], dim=1)
        done = (tokens == opts.eos_token_id) | (max_lengths[alive] <= n + 1)
        if bool(done.any()):
            final = scores / ((n + 1) ** opts.length_penalty)
            for i in done.nonzero()[:, 0].tolist():
                results[int(alive[i])] = [Hypothesis(_strip(history[i].tolist(), opts), float(final[i]))]
            keep = (~done).nonzero()[:, 0]
            if keep.numel() == 0:
                break
            stepper.reorder(keep, keep)
            alive, tokens, history, scores = alive[keep], tokens[keep], history[keep], scores[keep]
    return results


@dataclass
class BeamState:
    """Per live sentence: K running beams and up to K finished hypotheses.

    Token buffers have a width T padded with -1: the longest allowed output of a batch decoded
    together, or (continuous batching, sentences that started at different steps sharing one state)
    as far as the longest running sentence has got, widened as it goes.
    """

    run_scores: torch.Tensor  # (b, K) accumulated log-probs
    run_tokens: torch.Tensor  # (b, K, T) generated so far, -1 beyond each sentence's length
    fin_scores: torch.Tensor  # (b, K) normalised scores, best first
    fin_tokens: torch.Tensor  # (b, K, T) padded with -1
    fin_flags: torch.Tensor  # (b, K) True where the slot holds a real hypothesis
    improvable: torch.Tensor  # (b,) False once no running beam can beat the finished ones

    FIELDS = ("run_scores", "run_tokens", "fin_scores", "fin_tokens", "fin_flags", "improvable")

    @classmethod
    def start(cls, B: int, K: int, t_max: int, device: torch.device) -> BeamState:
        run_scores = torch.zeros(B, K, device=device)
        run_scores[:, 1:] = NEG  # all beams start identical: expand only the first
        return cls(
            run_scores,
            torch.full((B, K, t_max), -1, dtype=torch.long, device=device),
            torch.full((B, K), NEG, device=device),
            torch.full((B, K, t_max), -1, dtype=torch.long, device=device),
            torch.zeros(B, K, dtype=torch.bool, device=device),
            torch.ones(B, dtype=torch.bool, device=device),
        )

    def update(self, active: torch.Tensor | None, **values: torch.Tensor) -> None:
        """Take the new values of some fields; with active (b,), only active sentences' values, written
        into the tensors in place (a captured CUDA graph keeps reading them)."""
        for name, new in values.items():
            if active is None:
                setattr(self, name, new)
            else:
                old = getattr(self, name)
                old.copy_(torch.where(active.view(-1, *[1] * (old.dim() - 1)), new, old))

    def select(self, keep: torch.Tensor) -> None:
        for name in self.FIELDS:
            setattr(self, name, getattr(self, name)[keep])

    @property
    def width(self) -> int:
        """T: the token buffers' positions."""
        return self.run_tokens.shape[2]

    def widen(self, width: int) -> None:
        """Pad the token buffers with -1 to `width` positions."""
        for name in ("run_tokens", "fin_tokens"):
            old = getattr(self, name)
            if old.shape[2] < width:
                setattr(self, name, F.pad(old, (0, width - old.shape[2]), value=-1))

    def extend(self, other: BeamState) -> None:
        """Append other's sentences (same K) after this state's; token buffers take the wider width."""
        width = max(self.width, other.width)
        self.widen(width)
        other.widen(width)
        for name in self.FIELDS:
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))


def beam_step(
    log_probs: torch.Tensor,
    state: BeamState,
    pos: torch.Tensor,
    max_lengths: torch.Tensor,
    opts: SearchOptions,
    *,
    length_penalty: torch.Tensor | None = None,
    early_stopping: torch.Tensor | None = None,
    active: torch.Tensor | None = None,
    plan: execution.Plan | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Advance every live sentence's beam by one token.

    Args:
        log_probs: (b, K, V) constrained log-probabilities of each beam's next token.
        state: the b sentences' beams, updated.
        pos: (b,) tokens each sentence has generated so far.
        max_lengths: (b,) generated-token limit of each sentence.
        length_penalty, early_stopping: (b,) each sentence's own, in place of opts'.
        active: (b,) bool: only these sentences' beams change, written into the state's tensors in
            place, and nothing waits on the device (the static decode state, model/decode/slots.py).
        plan: which kernels compute (the model's; default: this process's, model/kernels/execution.py).
    Returns:
        source beam (b, K) and token (b, K) of each new running beam, and done (b,) per sentence.
    """
    b, K, _ = log_probs.shape
    T = state.width
    length = pos + 1  # (b,)
    norm = length_norms(pos, log_probs.dtype, opts.length_penalty if length_penalty is None else length_penalty)
    plan = plan or execution.probe()
    if active is None and length_penalty is None and early_stopping is None and _in_c(log_probs, state, K, plan):
        fields = tuple(getattr(state, name) for name in BeamState.FIELDS)
        return ops.beam_step(log_probs, fields, pos, max_lengths, norm.view(b), opts.eos_token_id, opts.early_stopping)
    early = opts.early_stopping if early_stopping is None else early_stopping  # bool or (b,)
    chunk = CHUNK if log_probs.device.type == "cpu" else None  # a GPU's topk kernel is fast as it is
    top_scores, top_beam, top_token = top_candidates(log_probs, state.run_scores, 2 * K, chunk=chunk, plan=plan)
    at_limit = max_lengths <= length  # (b,)
    hits = (top_token == opts.eos_token_id) | at_limit[:, None]  # (b, 2K) candidates that end here

    # The K best candidates that did not end keep running.
    running = top_scores + hits.float() * NEG
    keep = top_indices(running, K)  # (b, K)
    src_beam, token = top_beam.gather(1, keep), top_token.gather(1, keep)

    # Candidates ranked among the top K that ended may enter the finished set.
    qualifies = hits & (torch.arange(2 * K, device=hits.device) < K) & state.improvable[:, None]
    if early is not False:
        qualifies &= ~(state.fin_flags.all(1) & early)[:, None]
    fin_scores, fin_tokens, fin_flags = state.fin_scores, state.fin_tokens, state.fin_flags
    if active is not None or bool(qualifies.any()):  # nothing qualifies: the merge would keep them as they are
        seqs = _extend(state.run_tokens, top_beam, top_token, pos)  # (b, 2K, T)
        merged_scores = torch.cat([fin_scores, top_scores / norm + (~qualifies).float() * NEG], dim=1)  # (b, 3K)
        best = top_indices(merged_scores, K)  # (b, K) of 3K
        fin_scores = merged_scores.gather(1, best)
        fin_tokens = torch.cat([fin_tokens, seqs], dim=1).gather(1, best[:, :, None].expand(b, K, T))
        fin_flags = torch.cat([fin_flags, qualifies], dim=1).gather(1, best)

    run_scores = running.gather(1, keep)
    best_possible = run_scores[:, 0] / norm[:, 0]
    all_finished = fin_flags.all(1)
    improvable = state.improvable & (~all_finished | (best_possible > fin_scores.min(1).values))
    done = ~improvable | at_limit
    if early is not False:
        done |= all_finished & early
    state.update(
        active,
        run_scores=run_scores,
        run_tokens=_extend(state.run_tokens, src_beam, token, pos),
        fin_scores=fin_scores,
        fin_tokens=fin_tokens,
        fin_flags=fin_flags,
        improvable=improvable,
    )
    return src_beam, token, done


def _in_c(log_probs: torch.Tensor, state: BeamState, K: int, plan: execution.Plan) -> bool:
    """Whether beam_step runs in C (c_search.beam_step, the same answer): the plan's kernels take the log-probs, a
    state of contiguous tensors (the static decode state's, written in place per slot, keeps this module's ops)."""
    return (
        plan.takes(log_probs)
        and 2 * K <= c_search.MOST_CANDIDATES
        and log_probs.is_contiguous()
        and all(getattr(state, name).is_contiguous() for name in BeamState.FIELDS)
    )


def top_candidates(
    log_probs: torch.Tensor,
    run_scores: torch.Tensor,
    n: int,
    *,
    chunk: int | None = None,
    plan: execution.Plan | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The n best of run_scores[:, k] + log_probs[:, k, v] over every beam k and token v, best first;
    equal scores by beam, then token id, lower first (top_indices); in one C pass where `plan` (default: this
    process's) takes the tensors.

    log_probs (b, K, V), run_scores (b, K) -> scores, beam, token, each (b, n).

    The plain way ranks all (b, K * V). On CPU, torch.topk over a row of V costs about 10 us a row
    whatever n is: half the output GEMM's time at beam 4 batch 64. With `chunk`, the vocabulary is cut
    into blocks of that many tokens and only block maxima are ranked first: a candidate among the n
    best lies in one of the n blocks whose maxima (plus their beam's score) rank best, as each
    better-ranked block holds a better candidate (or an equal one of lower beam or token id); those n
    blocks' tokens are then ranked. The same candidates in 2.5-3x less time on (64, 4, 8000).
    """
    b, K, V = log_probs.shape
    takes = (plan or execution.probe()).takes(log_probs)
    if takes and run_scores.dtype == torch.float32 and n <= min(c_search.MOST_CANDIDATES, K * V):
        return ops.top_candidates(log_probs, run_scores, n)  # the same answer, in one pass
    if chunk is None or 4 * chunk > V:  # too few blocks to gain from them
        scores = (log_probs + run_scores[:, :, None]).view(b, K * V)
        pick = top_indices(scores, n)  # (b, n) of K * V
        return scores.gather(1, pick), pick // V, pick % V
    C, tail = divmod(V, chunk)
    block_max = log_probs[..., : C * chunk].view(b, K, C, chunk).amax(-1)  # (b, K, C)
    if tail:  # the last tokens form a shorter block
        block_max = torch.cat([block_max, log_probs[..., C * chunk :].amax(-1, keepdim=True)], dim=2)
        C += 1
    blocks = top_indices((block_max + run_scores[:, :, None]).view(b, K * C), n)  # (b, n)
    beam = blocks // C
    token = (blocks % C)[:, :, None] * chunk + torch.arange(chunk, device=log_probs.device)  # (b, n, chunk)
    values = log_probs.view(b, K * V).gather(1, (beam[:, :, None] * V + token.clamp(max=V - 1)).view(b, -1))
    values = values.view(b, n, chunk).masked_fill(token >= V, float("-inf")) + run_scores.gather(1, beam)[:, :, None]
    order = (beam[:, :, None] * V + token).view(b, n * chunk)  # each candidate's place in (K * V)
    values, token = values.view(b, n * chunk), token.view(b, n * chunk)
    pick = top_indices(values, n, order)  # (b, n)
    return values.gather(1, pick), beam.gather(1, pick // chunk), token.gather(1, pick)


def top_indices(scores: torch.Tensor, n: int, order: torch.Tensor | None = None) -> torch.Tensor:
    """Where the n best of each row of scores (b, M) are, best first; equal scores rank by `order` (b, M)
    (distinct, below 2**32; by default the position), lower first. torch.topk leaves ties in no set order,
    and low-precision logits tie often (bfloat16 keeps 8 bits): ranked by (score, order), one beam picks
    the token greedy search's argmax does, and each search keeps its candidates in one order everywhere.

    Each float32 score's bits become an integer of the same order (a negative's magnitude bits flipped),
    shifted above the order's place, less the order; topk over those int64 keys has no ties. (Subtracting
    keeps every constant within 32 bits, as Triton needs of inductor's code for it.)
    """
    bits = (scores + 0.0).view(torch.int32)  # + 0.0: -0.0 becomes +0.0, equal to it
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # (b, M): as the scores are, as signed integers
    if order is None:
        order = torch.arange(scores.shape[1], device=scores.device)
    return ((ordered.to(torch.int64) << 32) - order).topk(n, dim=1).indices


def _extend(tokens: torch.Tensor, beam: torch.Tensor, token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Prefixes of beams `beam` (b, M) from tokens (b, K, T), with `token` (b, M) written at pos (b,)."""
    b, M = beam.shape
    T = tokens.shape[2]
    seqs = tokens.gather(1, beam[:, :, None].expand(b, M, T))  # (b, M, T)
    at = pos.clamp(max=T - 1)[:, None, None].expand(b, M, 1)  # a static state's finished slot's pos may reach T
    return seqs.scatter_(2, at, token[:, :, None])


def beam_search(
    stepper: Stepper, max_lengths: torch.Tensor, opts: SearchOptions, plan: execution.Plan | None = None
) -> list[list[Hypothesis]]:
    """Beam search of B sentences; returns each one's num_hypotheses best, best first. `plan`: which kernels
    compute the beam steps (the model's; default: this process's, model/kernels/execution.py)."""
    plan = plan or execution.probe()
    B, K = max_lengths.numel(), opts.beam_size
    device = max_lengths.device
    state = BeamState.start(B, K, int(max_lengths.max()), device)
    alive = torch.arange(B, device=device)
    limits = max_lengths  # (b,) of the live sentences
    # Step 0 decodes one row per sentence: its K beams are all the start token, one hypothesis
    # (CTranslate2 does the same on CPU); the first reorder then gives each sentence K rows.
    tokens = torch.full((B,), opts.start_token_id, dtype=torch.long, device=device)
    results: list[list[Hypothesis]] = [[] for _ in range(B)]
    advance: c_search.BeamAdvance | None = None
    steps_in_c: BeamSteps | None = getattr(stepper, "beam_steps", None)
    n, last = 0, int(max_lengths.max())
    while n < last:
        b = alive.numel()
        ran = None
        if n and advance is not None and steps_in_c is not None:
            ran = steps_in_c(tokens, n, advance, _norms(last, opts.length_penalty)[n:])
        if ran is not None:  # steps as below, in one call, up to one where a sentence is done
            taken, (src_beam, token, done, rows, ended), log_probs = ran
            n += taken - 1  # the last step taken
            tokens = token.view(-1)
            if not ended:  # it stopped short (the cache's end), every row having followed its beam
                n += 1
                continue
        else:
            log_probs = stepper.step(tokens, n)  # (b*K, V); (b, V) at step 0
            if n == 0:
                log_probs = log_probs.repeat_interleave(K, dim=0)  # (b*K, V)
                advance = advance_in_c(log_probs, state, limits, opts, plan)
            if advance is not None:  # the constraints and the beam step in one C call: the same answer
                norm = _norm(n + 1, opts.length_penalty)
                src_beam, token, done, rows, ended = advance(log_probs.view(b, K, -1), n, norm)
                if not ended:  # the common step: every sentence goes on, each beam continues a row of its own
                    stepper.reorder(rows, None)
                    tokens = token.view(-1)
                    n += 1
                    continue
            else:
                log_probs = constrain(log_probs, n, limits.repeat_interleave(K), opts, state.run_tokens.view(b * K, -1))
                pos = torch.full((b,), n, device=device)
                src_beam, token, done = beam_step(log_probs.view(b, K, -1), state, pos, limits, opts, plan=plan)
        for i in done.nonzero()[:, 0].tolist():
            results[int(alive[i])] = finished_hypotheses(state, i, opts)
        keep = (~done).nonzero()[:, 0]
        if keep.numel() == 0:
            break
        # Beam reorder and finished-row removal at once; after step 0 every beam continues its sentence's row.
        rows = (keep[:, None] * K + src_beam[keep] if n else keep[:, None].expand(-1, K)).reshape(-1)
        stepper.reorder(rows, keep if keep.numel() < b else None)
        if keep.numel() < b:
            state.select(keep)
            alive, limits = alive[keep], limits[keep]
            if advance is not None:
                advance = advance_in_c(log_probs, state, limits, opts, plan)
        tokens = token[keep].view(-1)
        n += 1
    return results


def length_norms(pos: torch.Tensor, dtype: torch.dtype, penalty: float | torch.Tensor) -> torch.Tensor:
    """(b, 1): each sentence's (pos + 1) ** length_penalty, the divisor of its finished scores; pos (b,) tokens
    generated so far, penalty one for all or (b,) per sentence."""
    return (pos + 1).to(dtype)[:, None] ** (penalty[:, None] if isinstance(penalty, torch.Tensor) else penalty)


def advance_in_c(
    log_probs: torch.Tensor, state: BeamState, limits: torch.Tensor, opts: SearchOptions, plan: execution.Plan
) -> c_search.BeamAdvance | None:
    """The C call of a whole beam step (constrain, then beam_step) over this state, where it runs: the plan's
    kernels take the log-probs, the ranking's 2 K candidates within the kernel's, no n-gram rule (it reads the
    history in PyTorch)."""
    K = opts.beam_size
    if not (plan.takes(log_probs) and 2 * K <= c_search.MOST_CANDIDATES and opts.no_repeat_ngram_size == 0):
        return None
    return c_search.BeamAdvance(
        tuple(getattr(state, name) for name in BeamState.FIELDS),
        limits.contiguous(),
        eos=opts.eos_token_id,
        early_stopping=opts.early_stopping,
        suppressed=opts.suppressed_token_ids,
        min_length=opts.min_decoding_length,
        forced_bos=opts.forced_bos_token_id,
        forced_eos=opts.forced_eos_token_id,
    )


@functools.lru_cache(maxsize=4096)
def _norm(length: int, penalty: float) -> float:
    """length ** penalty as beam_step computes it for one sentence (length_norms of one float32 value)."""
    return float(length_norms(torch.tensor([length - 1]), torch.float32, penalty))


@functools.lru_cache(maxsize=64)
def _norms(steps: int, penalty: float) -> torch.Tensor:
    """(steps,) float32: step n's _norm(n + 1, penalty), made once per decode length (read, never written)."""
    return torch.tensor([_norm(n + 1, penalty) for n in range(steps)])


def finished_hypotheses(state: BeamState, i: int, opts: SearchOptions) -> list[Hypothesis]:
    """Sentence i's num_hypotheses best finished hypotheses, best first."""
    out = []
    for k in range(opts.num_hypotheses):
        if bool(state.fin_flags[i, k]):
            out.append(Hypothesis(_strip(state.fin_tokens[i, k].tolist(), opts), float(state.fin_scores[i, k])))
    return out


def _strip(tokens: list[int], opts: SearchOptions) -> list[int]:
    """Drop padding (-1) and the final </s>."""
    out = [t for t in tokens if t >= 0]
    return out[:-1] if out and out[-1] == opts.eos_token_id else out
