"""The models a server serves, and the language pairs each one answers.

Two ways to say it:
- `models` (BEAMSERVE_MODELS): comma-separated shipped names or directories, one pair each, the pair
  read from the name's end (`en-de`, `.../opus-mt-en-de`);
- `model_registry` (BEAMSERVE_MODEL_REGISTRY): a list of entries, as JSON (inline, or a file's path)
  or YAML in the Serve config's args. An entry names its directory, its source and target languages
  (several for a multilingual model), the token that picks each target language where the model
  takes one (`>>fr<<` for opus-mt-en-ROMANCE, `>>fra<<` for the Tatoeba Challenge's models: the tokens
  of the model's vocabulary, put in front of every source sentence; checked when the model loads), and
  settings of its own (compute type, device, batching sizes) over the server's:

      [{"name": "en-romance", "path": "/models/opus-mt-en-ROMANCE", "sources": ["en"],
        "targets": ["fr", "es", "it"],
        "target_tokens": {"fr": ">>fr<<", "es": ">>es<<", "it": ">>it<<"},
        "settings": {"compute_type": "int8", "max_batch_size": 32}}]

A model that names languages by token (NLLB-200, M2M100) needs no tokens listed: its languages are read
from its vocabulary (torch-free, when the registry is read) and named by the API's codes
(service/text/language_codes.py); `sources` and `targets` may list some of them, or be ["*"] for all, and
`language_tokens` may add or change codes ({"zt": "zho_Hant"}):

      [{"name": "nllb", "path": "/models/nllb-200-distilled-600M", "sources": ["*"], "targets": ["*"]}]

Each entry is one Serve deployment (`model-<name>`); each (source, target) it lists routes to it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator

from model.shipped import resolve_model_path
from service.errors import CodedError
from service.text.language_codes import api_languages

# Settings an entry may set for its own replicas (the rest are the server's: limits, keys, host...).
ENTRY_SETTINGS = {
    "device",
    "dtype",
    "compute_type",
    "threads",
    "replica_cpus",
    "replica_gpus",
    "static_slots",
    "compiled_step",
    "allocator",
    "mode",
    "max_batch_tokens",
    "max_batch_size",
    "batch_wait_ms",
    "max_queue",
    "decode_slots",
    "max_waiting_steps",
    "waiting_served_ratio",
    "max_queue_wait_s",
}
LANGUAGE = re.compile(r"^[a-z]{2,3}$")
ALL = "*"  # sources or targets: every language of a model with language tokens


class ModelUnavailableError(CodedError):
    """A model that cannot be loaded now (a pooled model whose files fail to load)."""

    code = "pair_unavailable"


class ModelEntry(BaseModel):
    """One model: where it is, the pairs it answers, and its own settings."""

    model_config = {"extra": "forbid"}

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$")  # the deployment is model-<name>
    path: str  # a directory, or a shipped model's name
    sources: list[str] = Field(min_length=1)
    targets: list[str] = Field(min_length=1)
    target_tokens: dict[str, str] = {}  # target language -> the token put before each source sentence
    # A model with language tokens (NLLB, M2M100): the API's code -> the model's own (en -> eng_Latn); filled
    # from its vocabulary by `with_model_languages`, entries given here added or taking precedence.
    language_tokens: dict[str, str] = {}
    settings: dict[str, Any] = {}
    pool: bool = False  # loaded on demand by the model pool (service/engine/pool.py), not a deployment of its own

    @field_validator("sources", "targets")
    @classmethod
    def _codes(cls, codes: list[str]) -> list[str]:
        lowered = [c.strip().lower() for c in codes]
        if lowered == [ALL]:
            return lowered
        bad = [c for c in lowered if not LANGUAGE.match(c)]
        if bad:
            raise ValueError(f"language codes are 2 or 3 letters: {bad}")
        return lowered

    @field_validator("settings")
    @classmethod
    def _settings(cls, settings: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(settings) - ENTRY_SETTINGS)
        if unknown:
            raise ValueError(f"settings an entry cannot set: {unknown}; it may set {sorted(ENTRY_SETTINGS)}")
        return settings

    @model_validator(mode="after")
    def _tokens(self) -> ModelEntry:
        self.target_tokens = {k.lower(): v for k, v in self.target_tokens.items()}
        stray = sorted(set(self.target_tokens) - set(self.targets))
        if stray:
            raise ValueError(f"{self.name}: target_tokens for languages it does not list as targets: {stray}")
        for token in self.target_tokens.values():
            if not (token.startswith(">>") and token.endswith("<<")):
                raise ValueError(f"{self.name}: a target token looks like >>fra<<, not {token!r}")
        return self

    def with_model_languages(self) -> ModelEntry:
        """The entry with its languages read from its model, for a model with language tokens (NLLB, M2M100):
        `language_tokens` filled, and ["*"] as sources or targets resolved to every language. ValueError
        for a listed language the model has no token for, and for language options on any other model."""
        from model.io import fairseq_vocab

        try:
            directory: Path | None = resolve_model_path(self.path)
        except FileNotFoundError:  # named when the model loads
            directory = None
        if directory is None or not fairseq_vocab.is_fairseq(directory):
            if self.language_tokens or ALL in (*self.sources, *self.targets):
                raise ValueError(
                    f"{self.name}: language_tokens and '*' are for models with language tokens (NLLB, M2M100); "
                    "list its languages, and target_tokens where it takes them"
                )
            if len(self.targets) > 1 and set(self.target_tokens) != set(self.targets):
                missing = sorted(set(self.targets) - set(self.target_tokens))
                raise ValueError(
                    f"{self.name}: a model with several targets needs a token for each; none for {missing}"
                )
            return self
        if self.target_tokens:
            raise ValueError(f"{self.name}: an NLLB or M2M100 model takes language_tokens, not target_tokens")
        model_codes = fairseq_vocab.language_tokens(fairseq_vocab.read_vocab(directory))
        unknown = sorted(c for c in self.language_tokens.values() if c not in model_codes)
        if unknown:
            raise ValueError(f"{self.name}: language_tokens name codes the model does not have: {unknown}")
        codes = api_languages(list(model_codes)) | {k.lower(): v for k, v in self.language_tokens.items()}
        found = {"sources": self.sources, "targets": self.targets}
        for side, listed in found.items():
            if listed == [ALL]:
                found[side] = sorted(codes)
            elif missing := sorted(set(listed) - set(codes)):
                raise ValueError(
                    f"{self.name}: {side} the model has no language token for: {missing}; add them to "
                    f"language_tokens, or choose among {', '.join(sorted(codes))}"
                )
        used = set(found["sources"]) | set(found["targets"])
        tokens = {code: token for code, token in codes.items() if code in used}
        return self.model_copy(update={**found, "language_tokens": tokens})

    def check_languages(self, codes: Mapping[str, int]) -> None:
        """ValueError naming each language token the loaded model lacks (a directory changed since the
        registry was read)."""
        unknown = sorted(token for token in self.language_tokens.values() if token not in codes)
        if unknown:
            raise ValueError(f"{self.name}: language tokens not in the model's vocabulary: {unknown}")

    def check_tokens(self, vocab: Mapping[str, int]) -> None:
        """ValueError naming each target token the model's vocabulary lacks, and the ones it has: an
        unknown token would be read as <unk>, and the model would translate into a language of its choosing."""
        unknown = {lang: tok for lang, tok in self.target_tokens.items() if tok not in vocab}
        if unknown:
            known = sorted(t for t in vocab if t.startswith(">>") and t.endswith("<<"))
            listed = ", ".join(known[:40]) + (f" and {len(known) - 40} more" if len(known) > 40 else "")
            raise ValueError(
                f"{self.name}: target tokens not in the model's vocabulary: "
                + ", ".join(f"{lang} {tok}" for lang, tok in unknown.items())
                + f"; its language tokens: {listed or 'none'}"
            )

    @property
    def pairs(self) -> list[str]:
        return [f"{s}-{t}" for s in self.sources for t in self.targets if s != t]


def pair_of(model: str) -> str:
    """'en-de' from a model name, a directory such as .../opus-mt-en-de, or a hub id such as
    Helsinki-NLP/opus-mt-en-de (whose snapshot's directory is named by its commit)."""
    resolve_model_path(model)  # FileNotFoundError for one that is nowhere
    name = Path(model.split("@")[0]).name
    match = re.search(r"([a-z]{2,3})-([a-z]{2,3})$", name)
    if not match:
        raise ValueError(
            f"cannot tell the language pair of model {model!r}: name its directory like 'en-de', "
            "or list it in model_registry with its languages"
        )
    return f"{match.group(1)}-{match.group(2)}"


def entries(models: str, registry: str | list[dict[str, Any]]) -> list[ModelEntry]:
    """The registry's entries when it is set, else one entry per model of `models`; ValueError names
    what is wrong (a bad entry, two entries answering one pair)."""
    if registry:
        raw = registry if isinstance(registry, list) else _read(registry)
        if not isinstance(raw, list):
            raise ValueError("model_registry is a list of entries")
        found = [ModelEntry.model_validate(item).with_model_languages() for item in raw]
    else:
        found = []
        for model in (m.strip() for m in models.split(",") if m.strip()):
            source, target = pair_of(model).split("-")
            found.append(ModelEntry(name=f"{source}-{target}", path=model, sources=[source], targets=[target]))
    if not found:
        raise ValueError("no models to serve: set models or model_registry")
    names = [e.name for e in found]
    if len(set(names)) != len(names):
        raise ValueError(f"model names repeat: {sorted(n for n in set(names) if names.count(n) > 1)}")
    routing(found)  # raises on a pair two entries answer
    return found


def routing(found: list[ModelEntry]) -> dict[str, ModelEntry]:
    """Each served pair's entry."""
    out: dict[str, ModelEntry] = {}
    for entry in found:
        for pair in entry.pairs:
            if pair in out:
                raise ValueError(f"{pair} is answered by two models: {out[pair].name} and {entry.name}")
            out[pair] = entry
    return out


def _read(text: str) -> Any:
    """Inline JSON, or a JSON or YAML file's path."""
    stripped = text.strip()
    if stripped.startswith("["):
        return json.loads(stripped)
    path = Path(stripped)
    if not path.is_file():
        raise ValueError(f"model_registry is neither inline JSON nor a file: {text!r}")
    if path.suffix in (".yaml", ".yml"):
        import yaml

        return yaml.safe_load(path.read_text(encoding="utf-8"))
    return json.loads(path.read_text(encoding="utf-8"))
