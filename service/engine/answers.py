"""What a model answers the gateway, typed: the replica's `translate()` answer (Decoded) and the
router's answer for a group of texts (Translated). Torch-free: both cross Ray's object store between
the model replica and the gateway, and the gateway never imports torch.
"""

from dataclasses import dataclass, field

from service.text.memory import Suggestion

NBest = list[tuple[str, float]]  # (text, score) hypotheses, best first


@dataclass(frozen=True)
class Decoded:
    """A model's translations of sentences (in the order asked): each one's n-best, its (source,
    target) token counts, and the request's time in the engine."""

    nbest: list[NBest]
    tokens: list[tuple[int, int]]
    queue_wait_s: float
    decode_s: float


@dataclass(frozen=True)
class Translated:
    """The router's translation of a group of texts (sentences, texts or documents, as the level that
    builds it says): each one's n-best, the tokens read and written, and with a pivot, each source
    sentence's translation into it."""

    nbest: list[NBest]
    source_tokens: int
    target_tokens: int
    pivot: dict[str, str] = field(default_factory=dict)
    # Each one's best hypothesis's (model/decode/confidence.py); None for a memory's answer no model scored.
    confidence: list[float | None] = field(default_factory=list)
    # With a translation memory asked: each one's sentences' unit matches (None: translated by the model), and
    # the units near a sentence that did not answer it, offered to edit.
    recalled: list[list[float | None]] = field(default_factory=list)
    suggested: list[list[Suggestion | None]] = field(default_factory=list)
