"""A translation's confidence: the geometric mean of the probabilities the model gave its tokens (the
exponent of their mean log-probability, </s> included), in (0, 1]. It ranks sentences by how likely they
are to be wrong (docs/benchmarks.md, "Confidence": its rank correlation with each sentence's chrF against a
reference, and how chrF falls bin by bin); it is not a probability of being right, and what a model is
sure of and wrong about (a fluent hallucination, a name mistranslated the same way every time) it does
not catch. Torch-free: the gateway computes it from the scores a replica answers."""

from __future__ import annotations

import math
from dataclasses import dataclass


def confidence(score: float, generated: int, length_penalty: float) -> float:
    """exp(mean token log-probability) of a hypothesis whose score is its summed log-probability over
    generated ** length_penalty (the search's normalisation), `generated` tokens with </s>."""
    if generated <= 0:
        return 1.0
    return math.exp(score * generated ** (length_penalty - 1.0))


@dataclass(frozen=True)
class ScoringResult:
    """A given translation's tokens as the model scores them teacher-forced (Translator.score, as CTranslate2's
    score_batch): each target token's log-probability, a language token forced first (NLLB, M2M100) and </s>
    included. `forced`: how many of the first tokens the search would force (its log-probability there is 0)."""

    tokens: list[str]  # the target's pieces, </s> last
    log_probs: list[float]
    forced: int = 0

    @property
    def total(self) -> float:
        return sum(self.log_probs)

    @property
    def normalized(self) -> float:
        """The mean token log-probability (CTranslate2's length-normalised score)."""
        return self.total / len(self.log_probs) if self.log_probs else 0.0

    @property
    def confidence(self) -> float:
        """confidence() of this text as a translation of the source: the forced tokens at probability 1, as
        the search counts them, so a translation's own confidence and its scored one are the same."""
        if not self.log_probs:
            return 1.0
        return math.exp(sum(self.log_probs[self.forced :]) / len(self.log_probs))

    def __repr__(self) -> str:
        return f"ScoringResult(normalized={self.normalized:.4f}, tokens={len(self.tokens)})"
