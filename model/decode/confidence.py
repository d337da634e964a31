"""A translation's confidence: the geometric mean of the probabilities the model gave its tokens (the
exponent of their mean log-probability, </s> included), in (0, 1]. It ranks sentences by how likely they
are to be wrong (docs/benchmarks.md, "Confidence": its rank correlation with each sentence's chrF against a
reference, and how chrF falls bin by bin); it is not a probability of being right, and what a model is
sure of and wrong about (a fluent hallucination, a name mistranslated the same way every time) it does
not catch. Torch-free: the gateway computes it from the scores a replica answers."""

from __future__ import annotations

import math


def confidence(score: float, generated: int, length_penalty: float) -> float:
    """exp(mean token log-probability) of a hypothesis whose score is its summed log-probability over
    generated ** length_penalty (the search's normalisation), `generated` tokens with </s>."""
    if generated <= 0:
        return 1.0
    return math.exp(score * generated ** (length_penalty - 1.0))
