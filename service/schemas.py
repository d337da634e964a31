"""Request and response bodies of the HTTP API."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class TranslateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    texts: list[str] = Field(min_length=1, description="texts to translate (a paragraph is split into sentences)")
    source: str = Field(min_length=2, max_length=16, examples=["en"])
    target: str = Field(min_length=2, max_length=16, examples=["de"])
    # Integers strictly: JSON true or "4" is a client's mistake, not beam size 1 or 4.
    beam_size: int = Field(4, ge=1, strict=True)
    num_hypotheses: int = Field(1, ge=1, strict=True)
    length_penalty: float = Field(1.0, ge=-5.0, le=5.0, allow_inf_nan=False)
    max_decoding_length: int | None = Field(None, ge=1, strict=True)
    min_decoding_length: int = Field(0, ge=0, strict=True,
                                     description="tokens generated before </s> is allowed (below max_decoding_length)")
    early_stopping: bool = Field(False, strict=True,
                                 description="stop a sentence once it has beam_size finished hypotheses")
    no_repeat_ngram_size: int = Field(0, ge=0, strict=True,
                                      description="> 0: no translation repeats a run of this many tokens")
    timeout_s: float | None = Field(None, gt=0, allow_inf_nan=False,
                                    description="answer 504 after this long (capped by the server)")
    tag_handling: Literal["html"] | None = Field(None, description=(
        "html: texts are HTML; prose is translated and inline markup carried over by alignment (DeepL's option)"))
    split_sentences: bool = Field(True, strict=True, description=(
        "translate each sentence of a text on its own and join them back (DeepL's option); false sends "
        "each text to the model whole"))

    @field_validator("source", "target")
    @classmethod
    def _language_code(cls, code: str) -> str:
        return code.strip().lower()  # language codes are case-insensitive: "EN" is "en"


class Translation(BaseModel):
    text: str
    score: float
    hypotheses: list[str] | None = None  # the n-best list when num_hypotheses > 1
    scores: list[float] | None = None


class Usage(BaseModel):
    source_tokens: int
    target_tokens: int


class TranslateResponse(BaseModel):
    model: str
    translations: list[Translation]
    usage: Usage


class ModelInfo(BaseModel):
    name: str
    source: str
    target: str
    device: str
    dtype: str
    max_source_tokens: int
    ready: bool


class ModelsResponse(BaseModel):
    models: list[ModelInfo]


class ErrorResponse(BaseModel):
    error: str
    detail: str | list[object]


class Language(BaseModel):
    code: str
    name: str
    targets: list[str]
