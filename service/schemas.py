"""Request and response bodies of the HTTP API."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_type_hints

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, create_model, field_validator, model_validator
from pydantic.config import JsonDict

from model.options import DecodeOptions, user_options

# Bounds the API sets beyond the library's own.
API_BOUNDS = {"length_penalty": {"ge": -5.0, "le": 5.0}}


def _whole(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _decode_fields() -> dict[str, Any]:
    """The API's decoding options, from model/options.py: name, type, default, bound and description."""
    hints = get_type_hints(DecodeOptions)
    out: dict[str, Any] = {}
    for f in user_options("api"):
        kind, default = hints[f.name], f.default
        if f.name == "max_decoding_length":
            kind, default = int | None, None  # absent: the server's cap
        # Numbers strictly: JSON true or "4" is a client's mistake, not beam size 1 or 4 (an integer is a float).
        extra: dict[str, Any] = {"strict": True} | ({} if hints[f.name] in (int, bool) else {"allow_inf_nan": False})
        low = f.metadata["minimum"]
        extra |= {"ge": low} if low is not None else API_BOUNDS.get(f.name, {})
        info: Any = Field(default, description=f.metadata["help"], **extra)
        if hints[f.name] is int:  # JSON's 4.0 is the integer 4 (JSON Schema's reading), 4.5 is not
            kind = Annotated[kind, BeforeValidator(_whole)]
        out[f.name] = (kind, info)
    return out


DecodeFields = create_model(
    "DecodeFields", __config__=ConfigDict(extra="forbid"), __module__=__name__, **_decode_fields()
)


# ignore_tags with any tag in it needs tag_handling html (the validator below), said in the schema too.
IGNORE_TAGS_NEED_HTML: JsonDict = {
    "if": {"properties": {"ignore_tags": {"type": "array", "minItems": 1}}, "required": ["ignore_tags"]},
    "then": {"properties": {"tag_handling": {"const": "html"}}, "required": ["tag_handling"]},
}


GLOSSARY_NEEDS_SOURCE: JsonDict = {
    "if": {"properties": {"glossary": {"not": {"type": "null"}}}, "required": ["glossary"]},
    "then": {"properties": {"source": {"type": "string", "not": {"enum": ["auto"]}}}, "required": ["source"]},
}

MEMORY_NEEDS_SOURCE: JsonDict = {
    "if": {"properties": {"memory": {"not": {"type": "null"}}}, "required": ["memory"]},
    "then": {"properties": {"source": {"type": "string", "not": {"enum": ["auto"]}}}, "required": ["source"]},
}


class MemoryRef(BaseModel):
    """A translation memory asked of a request, and how near a unit must be to answer a sentence."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(max_length=64, description="the memory's id (POST /v1/memories)")
    min_match: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="1: exact matches alone (after normalising whitespace and placeholders); below it, a unit at this "
        "fuzzy match (rapidfuzz's ratio) or nearer is looked up too, and answers where it says what the sentence "
        "says (its numbers and placeholders carried over, any other difference checked by the model); else it is "
        "offered in memory_suggestions",
    )


class TranslateRequest(DecodeFields):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"allOf": [IGNORE_TAGS_NEED_HTML, GLOSSARY_NEEDS_SOURCE, MEMORY_NEEDS_SOURCE]},
    )

    texts: list[str] = Field(min_length=1, description="texts to translate (a paragraph is split into sentences)")
    source: str | None = Field(
        None,
        min_length=2,
        max_length=16,
        examples=["en"],
        description="omitted or 'auto': each text's language is detected among the languages served",
    )
    target: str = Field(min_length=2, max_length=16, examples=["de"])
    timeout_s: float | None = Field(
        None, gt=0, strict=True, allow_inf_nan=False, description="answer 504 after this long (capped by the server)"
    )
    tag_handling: Literal["html"] | None = Field(
        None,
        description=(
            "html: texts are HTML; prose is translated and inline markup carried over by alignment (DeepL's option)"
        ),
    )
    cache: bool = Field(
        True,
        strict=True,
        description="answer sentences translated before from the gateway's cache (an answer equal to a fresh one)",
    )
    ignore_tags: list[str] | None = Field(
        None,
        max_length=100,
        description=(
            'with tag_handling html: tags whose content is kept as written, as translate="no" and '
            'class="notranslate" are (DeepL\'s option)'
        ),
    )
    split_sentences: bool = Field(
        True,
        strict=True,
        description=(
            "translate each sentence of a text on its own and join them back (DeepL's option); false sends "
            "each text to the model whole"
        ),
    )

    glossary: str | dict[str, str] | None = Field(
        None,
        description=(
            "a glossary's id (POST /v2/glossaries), or this request's own terms as {source term: target term}: "
            "each source term found as whole words comes out as its target term; needs the source named"
        ),
        examples=[{"bike": "Velo"}],
    )

    memory: str | MemoryRef | None = Field(
        None,
        description=(
            "a translation memory's id (POST /v1/memories), or {id, min_match}: each sentence the memory holds is "
            "answered from it, the rest translated; each translation then says where its sentences came from "
            "(origin, memory_matches) and the units near a sentence that did not answer it (memory_suggestions); "
            "needs the source named"
        ),
        examples=[{"id": "0f8e6a3c2b1d4e5f8a9b0c1d2e3f4a5b", "min_match": 0.9}],
    )

    @field_validator("source", "target")
    @classmethod
    def _language_code(cls, code: str | None) -> str | None:
        return code.strip().lower() if code is not None else None  # case-insensitive: "EN" is "en"

    @model_validator(mode="after")
    def _ignore_tags_need_html(self) -> TranslateRequest:
        if self.ignore_tags and self.tag_handling != "html":
            raise ValueError('ignore_tags applies to HTML: set "tag_handling": "html"')
        if self.glossary is not None and self.source in (None, "auto"):
            raise ValueError("a glossary needs the source language named")
        if self.memory is not None and self.source in (None, "auto"):
            raise ValueError("a translation memory needs the source language named")
        return self

    def recall(self) -> MemoryRef | None:
        """The memory asked, as {id, min_match}."""
        return MemoryRef(id=self.memory) if isinstance(self.memory, str) else self.memory


class DetectedLanguage(BaseModel):
    language: str
    confidence: float  # 0-1 among the languages served; 0 for a text with no letters


class MemorySuggestion(BaseModel):
    """A memory's unit near a sentence that it did not answer (the model translated the sentence): to edit."""

    source: str
    target: str
    match: float  # its fuzzy match in [0, 1]


class Translation(BaseModel):
    text: str
    score: float
    hypotheses: list[str] | None = None  # the n-best list when num_hypotheses > 1
    scores: list[float] | None = None
    detected_source: DetectedLanguage | None = None  # when the request named no source language
    pivot: str | None = None  # the language it went through, where no model translates the pair directly
    # (0, 1]: the geometric mean of the model's token probabilities, its least sure sentence's for a text of
    # several; a ranking of what to check (model/decode/confidence.py). None for a text answered as sent.
    confidence: float | None = None
    # With a translation memory asked: each sentence's unit match (1.0 exact; below it fuzzy) in order, None for
    # a sentence the model translated; origin sums them up.
    origin: Literal["model", "memory", "mixed"] | None = None
    memory_matches: list[float | None] | None = None
    # With a translation memory asked: each sentence's unit near it that did not answer it, None elsewhere.
    memory_suggestions: list[MemorySuggestion | None] | None = None


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str = Field(min_length=2, max_length=16, examples=["en"])
    target: str = Field(min_length=2, max_length=16, examples=["de"])
    texts: list[str] = Field(min_length=1, description="source sentences")
    translations: list[str] = Field(min_length=1, description="a translation of each text, to score")
    timeout_s: float | None = Field(
        None, gt=0, strict=True, allow_inf_nan=False, description="answer 504 after this long (capped by the server)"
    )

    @field_validator("source", "target")
    @classmethod
    def _language_code(cls, code: str) -> str:
        return code.strip().lower()

    @model_validator(mode="after")
    def _one_translation_a_text(self) -> ScoreRequest:
        if len(self.texts) != len(self.translations):
            raise ValueError(f"{len(self.texts)} texts and {len(self.translations)} translations: give one a text")
        return self


class Scored(BaseModel):
    tokens: list[str]  # the translation's pieces, </s> last (a multilingual model's target language token first)
    log_probs: list[float]  # each token's log-probability, teacher-forced
    total: float
    normalized: float  # the mean of log_probs (CTranslate2's length-normalised score)
    confidence: float  # as a translation's: exp(the mean), a forced language token at probability 1


class ScoreResponse(BaseModel):
    model: str
    scores: list[Scored]


class Usage(BaseModel):
    source_tokens: int
    target_tokens: int


class TranslateResponse(BaseModel):
    model: str
    translations: list[Translation]
    usage: Usage


class ModelInfo(BaseModel):
    name: str  # the pair, "en-de"
    source: str
    target: str
    model: str | None = None  # the registry's model that answers it (several pairs for a multilingual one)
    pool: dict[str, object] | None = None  # a pooled model's: the pool replica asked, the models it holds
    ready: bool  # false: the pair's replicas are down or loading (its requests get 503), the rest unknown
    device: str | None = None
    dtype: str | None = None
    compute_type: str | None = None  # float32, int8, ... (CTranslate2's names)
    digest: str | None = None  # the model's content digest (weights, vocabulary, compute type)
    kernels: str | None = None  # beamserve's C kernels in use: the build and its x86-64 level, or why none
    # Which kernels compute the model, decided at load: device, compute type, the decode step (C in one call, C by
    # sublayers, or PyTorch's operators) and each GEMM shape's kernel by row count (model/kernels/execution.py).
    plan: dict[str, object] | None = None
    max_source_tokens: int | None = None
    # The decoding options the model's generation_config.json sets, which a request that gives none decodes with
    # (num_hypotheses aside: the answer's shape is the request's).
    defaults: dict[str, object] | None = None
    license: str | None = None  # as the model card names it; None where it names none
    non_commercial: bool | None = None  # the licence forbids commercial use (CC-BY-NC-4.0: NLLB-200's weights)
    revision: str | None = None  # the Hugging Face hub commit, for a model loaded from the Hugging Face cache


class ModelsResponse(BaseModel):
    models: list[ModelInfo]


class ErrorResponse(BaseModel):
    error: str  # a stable code: invalid_request, unsupported_pair, overloaded, timeout, ...
    detail: str | list[object]  # what is wrong, for a person
    request_id: str  # also in the X-Request-ID header; the client's own when it sent one


class LibreError(BaseModel):
    """An error on LibreTranslate's routes, as its clients read it."""

    error: str  # what is wrong, for a person (Mastodon and the web client show it)
    code: str  # beamserve's stable code
    request_id: str


class DeepLError(BaseModel):
    """An error on DeepL's routes (/v2/...), as its clients read it."""

    message: str
    code: str
    request_id: str


def errors(model: type[BaseModel], *statuses: int) -> dict[int | str, dict[str, Any]]:
    """A route's `responses`: the error statuses it answers, each in its API's shape."""
    return {status: {"model": model} for status in statuses}


# Every route with a body: the ingress' own refusals (408 a stalled body, 413 too large, 415 compressed),
# a key's (401, 403, 429), the server's (500, 503 with Retry-After, 504).
BODY_ERRORS = (400, 401, 403, 408, 413, 415, 422, 429, 500, 503, 504)


class Readiness(BaseModel):
    status: str  # ready, starting, not ready, draining
    pairs: dict[str, str] | None = None  # each pair: ready or unavailable


class Language(BaseModel):
    code: str
    name: str
    targets: list[str]


class KeyUsage(BaseModel):
    client: str  # the key's name (or a digest of it); "anonymous" while keys are off
    characters_day: int  # characters translated in the current day window
    characters_day_limit: int  # 0: none
    characters_day_resets_at: float | None  # Unix time the window ends; None while it is empty
    characters_month: int  # in the current 30-day window
    characters_month_limit: int
    characters_month_resets_at: float | None
    requests_per_minute_limit: int
