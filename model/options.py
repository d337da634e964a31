"""Decoding options, defined once: the library, the CLI flags, the HTTP API schema and the batching
engine all derive from these fields (torch-free, so the service imports it without the model).

Each field's metadata says how users meet it: `help` (its description everywhere), `minimum`, and
`api` / `cli` (whether the HTTP API / the command line offer it). Names are CTranslate2's and
Hugging Face's.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields
from typing import Any

# Compute types by CTranslate2's names (what each means: model/kernels/compute_type.py); here, torch-free, for
# the CLI's choices and the service's settings.
COMPUTE_TYPES = ("default", "float32", "float16", "bfloat16", "int8", "int8_float32", "int8_bfloat16")


def option(default: Any, help: str, *, minimum: float | None = None, api: bool = True, cli: bool = True) -> Any:
    return field(default=default, metadata={"help": help, "minimum": minimum, "api": api, "cli": cli})


@dataclass(frozen=True, kw_only=True)
class DecodeOptions:
    """Decoding options, named as in CTranslate2 / Hugging Face."""

    beam_size: int = option(4, "beam width; 1 is greedy search", minimum=1)
    num_hypotheses: int = option(1, "n-best list size, at most beam_size", minimum=1)
    length_penalty: float = option(
        1.0, "score = sum(log p) / generated_length ** length_penalty (Hugging Face's formula)"
    )
    max_decoding_length: int = option(256, "generated tokens, </s> included", minimum=1)
    min_decoding_length: int = option(0, "tokens generated before </s> is allowed", minimum=0)
    no_repeat_ngram_size: int = option(0, "> 0: no translation repeats a run of this many tokens", minimum=0)
    early_stopping: bool = option(
        False, "stop a sentence once it has beam_size finished hypotheses (CTranslate2's rule)"
    )
    forced_bos_token_id: int | None = option(
        None,
        "token forced as the first generated one: a multilingual model's target language (NLLB, M2M100)",
        api=False,
        cli=False,
    )
    max_length_ratio: float | None = option(
        2.0, "also cap at ratio x source tokens + max_length_offset (None: off)", api=False, cli=False
    )
    max_length_offset: int = option(10, "see max_length_ratio", api=False, cli=False)
    truncate: bool = option(
        False, "cut sources longer than the model's maximum instead of failing", api=False, cli=False
    )
    max_batch_size: int = option(64, "sentences decoded together (sorted by length first)", minimum=1, api=False)

    def validate(self) -> None:
        """Raise ValueError naming the first option out of range."""
        for f in fields(self):
            low, value = f.metadata["minimum"], getattr(self, f.name)
            if low is not None and value < low:
                raise ValueError(f"{f.name} must be >= {low}, got {value}")
        if self.num_hypotheses > self.beam_size:
            raise ValueError(
                f"num_hypotheses must be between 1 and beam_size ({self.beam_size}), got {self.num_hypotheses}"
            )
        if self.min_decoding_length >= self.max_decoding_length:
            raise ValueError(
                f"min_decoding_length must be below max_decoding_length ({self.max_decoding_length}), "
                f"got {self.min_decoding_length}"
            )
        if not math.isfinite(self.length_penalty):
            raise ValueError("length_penalty must be a finite number")


@functools.cache
def user_options(surface: str) -> tuple[Any, ...]:
    """The DecodeOptions fields offered on `surface` ("api" or "cli"), in declaration order."""
    return tuple(f for f in fields(DecodeOptions) if f.metadata[surface])


def max_length(opts: DecodeOptions, source_len: int, positions: int) -> int:
    """A sentence's generated-token cap: the absolute cap, the ratio cap (source_len tokens), the positions."""
    cap = min(opts.max_decoding_length, positions)
    if opts.max_length_ratio is None:
        return cap
    return min(cap, math.ceil(opts.max_length_ratio * source_len) + opts.max_length_offset)
