"""A Hugging Face model's generation_config.json as decoding defaults: what transformers' `generate` takes from
that file when its caller does not say (the beam width, the length limits, the length penalty...), as the
DecodeOptions a Translator decodes with for every option its caller does not give (Translator.defaults).

An encoder-decoder's `max_length` and `min_length` count the decoder's start token, which beamserve's
`max_decoding_length` and `min_decoding_length` do not; `max_new_tokens` and `min_new_tokens` count as ours
and win over them, as in `generate`. Keys that name the model's own tokens are read into its config
(model/io/checkpoint.py); keys `generate` would apply that beamserve does not are named by `read` so that
the loader can say so (sampling, penalties other than the length's, beam groups, renormalised scores).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from model.options import DecodeOptions

FILE = "generation_config.json"
# generate's name -> ours, for the keys that mean the same.
SAME = {
    "num_beams": "beam_size",
    "num_return_sequences": "num_hypotheses",
    "length_penalty": "length_penalty",
    "no_repeat_ngram_size": "no_repeat_ngram_size",
}
# What the model's config takes (model/io/checkpoint.py) or what does not change a translation.
READ_ELSEWHERE = frozenset({
    "bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "forced_eos_token_id",
    "forced_bos_token_id", "transformers_version", "_from_model_config", "use_cache", "output_scores",
    "output_attentions", "output_hidden_states", "return_dict_in_generate", "max_time",
})  # fmt: skip
# generate's defaults of the keys beamserve does not apply: at these values they change nothing.
NEUTRAL: dict[str, Any] = {
    "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "diversity_penalty": 0.0, "num_beam_groups": 1,
    "renormalize_logits": False, "remove_invalid_values": False, "encoder_no_repeat_ngram_size": 0,
    "num_assistant_tokens": 20, "num_assistant_tokens_schedule": "constant",
}  # fmt: skip
# Sampling's knobs: they change nothing unless do_sample is set (generate ignores them then too).
SAMPLING = frozenset({"temperature", "top_k", "top_p", "typical_p", "min_p", "epsilon_cutoff", "eta_cutoff"})


@dataclass(frozen=True)
class Generation:
    """The decoding defaults of a model's generation_config.json, and what of it beamserve does not apply."""

    options: dict[str, Any] = field(default_factory=dict)  # DecodeOptions field -> the file's value
    ignored: tuple[str, ...] = ()  # the file's keys generate would apply and beamserve does not

    def defaults(self, base: DecodeOptions | None = None) -> DecodeOptions:
        """base (beamserve's own defaults unless given) with the file's options over it; ValueError naming the
        file where its values are not valid options (num_return_sequences over num_beams, say)."""
        opts = replace(base or DecodeOptions(), **self.options)
        try:
            opts.validate()
        except ValueError as exc:
            raise ValueError(f"{FILE}: {exc}") from None
        return opts


def read(directory: Path, pad_token_id: int) -> Generation:
    """The generation config of a model directory (none: beamserve's defaults); pad_token_id is the model's, which
    beamserve never generates (so a bad_words_ids of it alone is what it does anyway)."""
    path = directory / FILE
    if not path.is_file():
        return Generation()
    config = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(config, dict):
        raise ValueError(f"{path}: not a JSON object")
    if config.get("bad_words_ids") == [[pad_token_id]]:
        config = {**config, "bad_words_ids": None}
    return parse(config)


def parse(config: dict[str, Any]) -> Generation:
    options: dict[str, Any] = {ours: config[theirs] for theirs, ours in SAME.items() if config.get(theirs) is not None}
    if config.get("max_new_tokens") is not None:
        options["max_decoding_length"] = int(config["max_new_tokens"])
    elif config.get("max_length") is not None:  # the start token is one of max_length's
        options["max_decoding_length"] = max(1, int(config["max_length"]) - 1)
    if config.get("min_new_tokens") is not None:
        options["min_decoding_length"] = int(config["min_new_tokens"])
    elif config.get("min_length") is not None:
        options["min_decoding_length"] = max(0, int(config["min_length"]) - 1)
    stopping = config.get("early_stopping")
    if isinstance(stopping, bool):  # "never" is generate's third rule, which beamserve does not have
        options["early_stopping"] = stopping
    sampling = bool(config.get("do_sample"))
    ignored = [
        key
        for key, value in config.items()
        if key not in READ_ELSEWHERE
        and key not in SAME
        and key not in ("max_new_tokens", "max_length", "min_new_tokens", "min_length", "do_sample")
        and not (key == "early_stopping" and isinstance(value, bool))
        and not (key in SAMPLING and not sampling)
        and not _inert(key, value)
    ]
    if sampling:
        ignored.insert(0, "do_sample")
    return Generation(options, tuple(ignored))


def _inert(key: str, value: Any) -> bool:
    """Whether a key's value is generate's default, which changes nothing (repetition_penalty 1.0, ...)."""
    return value is None or (key in NEUTRAL and value == NEUTRAL[key])
