"""A request's sentences answered from its translation memory where a unit says what the sentence says, the
model's translation elsewhere (service/text/memory.py says what a match carries over).

An exact match, and a fuzzy one that differs from its sentence in numbers and placeholders alone (carried
over), answer; a fuzzy match that differs in anything else answers only where the model agrees: its carried
target, scored against the sentence teacher-forced, is at most CHECK_MARGIN nats a token less likely than the
model's own translation (both as confidence() counts them). Where the model knows "not" from nothing, "two" from
"three", the unit's target is far less likely than its translation (docs/usage.md has such cases), and the match
is offered beside the translation instead (`suggested`). Every memory answer's confidence is the model's in
that text, as a translation's is; the match's ratio is in `recalled`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import replace

from model.decode.confidence import ScoringResult
from service import tracing
from service.engine.answers import NBest, Translated
from service.text.memory import Carried, Match, Recall, Suggestion, carried

# Character pairs of fuzzy lookups a request makes on the event loop (some 0.2 ms): more go to a thread, whose
# hop costs a request more than a lookup of a few sentences, as it waits for the GIL beside the engine's thread.
INLINE_WORK = 10_000_000
CHECK_MARGIN = 0.05  # nats a token a carried target may be less likely than the model's own translation
Decode = Callable[[list[str]], Awaitable[Translated]]
Score = Callable[[list[tuple[str, str]]], Awaitable[list[ScoringResult]]]


def agrees(scored: ScoringResult, own: float | None) -> bool:
    """Whether the model finds a unit's target about as likely as its own translation (confidence `own`)."""
    if own is None:
        return False
    return math.log(max(scored.confidence, 1e-300)) >= math.log(max(own, 1e-300)) - CHECK_MARGIN


async def lookups(sentences: list[str], recall: Recall) -> dict[str, Match]:
    """The memory's match for each distinct sentence it holds; fuzzy lookups of more than INLINE_WORK off the
    event loop."""
    asked = {"beamserve.sentences": len(sentences), "beamserve.memory.min_match": recall.min_match}
    with tracing.span("memory", **asked) as looked:
        if recall.min_match < 1.0 and recall.index.work(sentences, recall.min_match) > INLINE_WORK:
            found = await asyncio.to_thread(recall.index.find, sentences, recall.min_match, apart=True)
        else:  # exact matches, or fuzzy ones cheaper than the thread's hop: here
            found = recall.index.find(sentences, recall.min_match)
        if looked is not None:
            looked.set_attribute("beamserve.memory.found", len(found))
    return found


async def recalled(
    sentences: list[str], recall: Recall, decode: Decode, score: Score | None, length_penalty: float
) -> Translated:
    """The sentences' translation with the memory's units answering those they say (each one's n-best the
    carried target alone, scored by the model), `decode` the rest; `recalled` holds each sentence's match
    where a unit answered, `suggested` the match offered where one did not. `score`: None where no one model
    scores the pair (a pair through the pivot): a match the model would decide is then offered."""
    found = await lookups(sentences, recall)
    answers: dict[str, Carried] = {}
    offered: dict[str, Suggestion] = {}
    for sentence, match in found.items():
        carry = Carried(match.target, True) if match.score >= 1.0 else carried(match.source, match.target, sentence)
        if carry is None or (not carry.same and score is None):
            offered[sentence] = Suggestion(match.source, match.target, round(match.score, 4))
        else:
            answers[sentence] = carry
    rest = [s for s in dict.fromkeys(sentences) if s not in answers or not answers[s].same]
    asked = list(answers)
    if score is not None and asked:  # the model's translation and its scores of the units at once
        out, scores = await asyncio.gather(
            decode(rest) if rest else _nothing(), score([(s, answers[s].target) for s in asked])
        )
    else:
        out, scores = await decode(rest) if rest else Translated([], 0, 0), []
    scored = dict(zip(asked, scores, strict=True)) if scores else {}
    decoded = dict(zip(rest, zip(out.nbest, out.confidence, strict=True), strict=True))
    for sentence in [s for s in asked if not answers[s].same]:
        if not agrees(scored[sentence], decoded[sentence][1]):
            match = found[sentence]
            offered[sentence] = Suggestion(match.source, match.target, round(match.score, 4))
            del answers[sentence]
    nbest: list[NBest] = []
    sure: list[float | None] = []
    matches: list[list[float | None]] = []
    suggested: list[list[Suggestion | None]] = []
    for sentence in sentences:
        if sentence in answers:
            s = scored.get(sentence)
            normalised = s.total / max(1, len(s.log_probs)) ** length_penalty if s is not None else 0.0  # the search's
            nbest.append([(answers[sentence].target, normalised)])
            sure.append(s.confidence if s is not None else None)
            matches.append([round(found[sentence].score, 4)])
        else:
            nbest.append(decoded[sentence][0])
            sure.append(decoded[sentence][1])
            matches.append([None])
        suggested.append([offered.get(sentence)])
    return replace(out, nbest=nbest, confidence=sure, recalled=matches, suggested=suggested)


async def _nothing() -> Translated:
    return Translated([], 0, 0)


async def _no() -> list[ScoringResult]:
    return []
