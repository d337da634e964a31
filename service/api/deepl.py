"""DeepL's API v2 (POST /v2/translate, GET /v2/languages, GET /v2/usage) as its official clients speak
it: JSON or form bodies, DeepL's upper-case language codes (EN-GB is English), its option names, its
error body {"message": ...} and its statuses (400 for a bad request, 429 for too many, 456 for a used-up
character quota). Options beamserve cannot honour are refused by name, never ignored.
"""

from pathlib import PurePath
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from service.api.bodies import multipart_body, openapi_body
from service.errors import ApiError, message
from service.schemas import MemorySuggestion, TranslateRequest, TranslateResponse
from service.text.documents import FILE_FIELD, FORMATS
from service.text.languages import name

PREFIXES = ("/v2/", "/v3/")  # where errors are answered in DeepL's shape
UNLIMITED = 10**12  # the character_limit DeepL reports for a key without one
# Error codes DeepL's clients know by another status: overload is "too many requests" (they back off),
# a used-up character quota is 456, and any key problem is 403 (its clients read 401 as an unknown error).
DEEPL_STATUS = {"overloaded": 429, "quota_exceeded": 456, "missing_api_key": 403, "invalid_api_key": 403}

# DeepL's options that beamserve has no counterpart for, each with why.
UNSUPPORTED = {
    "glossary_ids": "glossary_ids is not supported: pass one glossary_id",
    "context": "context is not supported: send it as part of the text",
    "model_type": "model_type is not supported: each pair has one model",
    "outline_detection": "outline_detection applies to tag_handling xml, which is not supported",
    "non_splitting_tags": "non_splitting_tags applies to tag_handling xml, which is not supported",
    "splitting_tags": "splitting_tags applies to tag_handling xml, which is not supported",
    "tag_handling_version": "tag_handling_version is not supported",
    "custom_instructions": "custom_instructions are not supported",
    "style_id": "style rules are not supported",
}


def _form_integer(value: Any) -> Any:
    """A form's integer, ASCII digits, as the number, and a JSON number JSON Schema counts as an integer (75.0,
    1e2) as one; anything else as it is, for the field to refuse (true, 75.5)."""
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return int(value) if isinstance(value, float) and value.is_integer() else value


class DeepLTranslateRequest(BaseModel):
    """The body of DeepL's POST /v2/translate (JSON, or a form with `text` repeated)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={  # DeepL's rule: a glossary, or a translation memory, needs the source language
            "allOf": [
                {
                    "if": {"properties": {field: {"type": "string"}}, "required": [field]},
                    "then": {"properties": {"source_lang": {"type": "string"}}, "required": ["source_lang"]},
                }
                for field in ("glossary_id", "translation_memory_id")
            ]
        },
    )

    text: list[str] = Field(min_length=1, description="texts to translate")
    target_lang: str = Field(min_length=2, max_length=16, examples=["DE"])
    source_lang: str | None = Field(None, min_length=2, max_length=16, description="omitted: detected per text")
    split_sentences: Literal["0", "1", "nonewlines"] = Field(
        "1", description="1 and nonewlines: each sentence translated on its own; 0: each text whole"
    )
    preserve_formatting: bool = Field(False, description="accepted: beamserve never reformats a translation")
    tag_handling: Literal["html", "xml"] | None = Field(None, description="html (xml is not supported)")
    ignore_tags: list[str] | None = Field(None, description="with tag_handling html: tags kept as written")
    formality: Literal["default", "prefer_more", "prefer_less", "more", "less"] = Field(
        "default", description="default and prefer_*: accepted (the models have one register); more/less: 400"
    )
    show_billed_characters: bool = Field(False, description="billed_characters is always answered")
    glossary_id: str | None = Field(None, description="a glossary of this key (POST /v2/glossaries); needs source_lang")
    translation_memory_id: str | None = Field(
        None, max_length=64, description="a translation memory of this key (POST /v1/memories); needs source_lang"
    )
    translation_memory_threshold: Annotated[int, BeforeValidator(_form_integer)] = Field(
        75, ge=0, le=100, strict=True, description="the least match, in percent, at which a memory's unit answers"
    )


OPENAPI = openapi_body(DeepLTranslateRequest)


class DeepLTranslation(BaseModel):
    detected_source_language: str
    text: str
    billed_characters: int
    confidence: float | None = None  # beamserve's: the model's confidence (as /v1's); DeepL's clients ignore it
    # beamserve's, with a translation memory: where its sentences came from (as /v1's)
    origin: str | None = None
    memory_matches: list[float | None] | None = None
    memory_suggestions: list[MemorySuggestion | None] | None = None


class DeepLTranslateResponse(BaseModel):
    translations: list[DeepLTranslation]


class DeepLLanguage(BaseModel):
    language: str
    name: str
    supports_formality: bool | None = None  # target languages only


class DeepLUsage(BaseModel):
    character_count: int
    character_limit: int


def code_of(deepl_code: str) -> str:
    """DeepL's code as the router reads language tags (service/text/language_tags.py): EN-GB and EN-US
    are en, PT-BR is pt, ZH-HANT Traditional Chinese (zt), not Simplified."""
    return deepl_code.strip().lower()


def deepl_codes(code: str, *, target: bool) -> list[str]:
    """DeepL's codes for one of beamserve's languages (English and Portuguese targets have variants)."""
    variants = {"en": ["EN-GB", "EN-US"], "pt": ["PT-BR", "PT-PT"]}
    return variants[code] if target and code in variants else [code.upper()]


def form_field(name: str, values: list[str]) -> Any:
    """A form field's value: `text` and `ignore_tags` may be given several times (DeepL's forms also take
    ignore_tags as one comma-separated value), any other field once."""
    if name == "text":
        return values
    if name == "ignore_tags":
        return [tag for v in values for tag in v.split(",") if tag]
    return values[0]


def parse(body: dict[str, Any]) -> tuple[DeepLTranslateRequest, TranslateRequest]:
    """DeepL's request and the beamserve request it runs as; ApiError 400 (in DeepL's words) otherwise."""
    for option, why in UNSUPPORTED.items():
        if option in body:
            raise ApiError("unsupported_option", why)
    if isinstance(body.get("text"), str):  # one text given as a string
        body = {**body, "text": [body["text"]]}
    if isinstance(body.get("ignore_tags"), str):
        body = {**body, "ignore_tags": [t for t in body["ignore_tags"].split(",") if t]}
    if isinstance(body.get("split_sentences"), int) and not isinstance(body.get("split_sentences"), bool):
        body = {**body, "split_sentences": str(body["split_sentences"])}
    try:
        deepl = DeepLTranslateRequest.model_validate(body)
    except ValidationError as exc:
        problems = message({"detail": exc.errors()})
        raise ApiError("invalid_request", f"Value for a parameter is not valid: {problems}") from None
    if deepl.tag_handling == "xml":
        raise ApiError("unsupported_option", "tag_handling xml is not supported; html is")
    if deepl.formality in ("more", "less"):
        raise ApiError("unsupported_option", "formality is not supported for any target language")
    try:
        req = TranslateRequest(
            texts=deepl.text,
            source=code_of(deepl.source_lang) if deepl.source_lang else None,
            target=code_of(deepl.target_lang),
            split_sentences=deepl.split_sentences != "0",
            tag_handling="html" if deepl.tag_handling == "html" else None,
            # DeepL applies ignore_tags only with tag handling; without it the option has nothing to act on.
            ignore_tags=deepl.ignore_tags if deepl.tag_handling == "html" else None,
            glossary=deepl.glossary_id,
            memory=(
                {"id": deepl.translation_memory_id, "min_match": deepl.translation_memory_threshold / 100}
                if deepl.translation_memory_id
                else None
            ),
        )
    except ValidationError as exc:
        raise ApiError("invalid_request", message({"detail": exc.errors()})) from None
    return deepl, req


class DeepLDictionary(BaseModel):
    """One dictionary of a v3 glossary: a language pair's entries (PUT /v3/glossaries/{id}/dictionaries's body)."""

    model_config = ConfigDict(extra="forbid")

    source_lang: str = Field(min_length=2, max_length=16, examples=["EN"])
    target_lang: str = Field(min_length=2, max_length=16, examples=["DE"])
    entries: str = Field(description="one entry per line: source<TAB>target (tsv) or source,target (csv)")
    entries_format: Literal["tsv", "csv"] = "tsv"


class DeepLGlossaryRequest(DeepLDictionary):
    """The body of DeepL's POST /v2/glossaries (JSON or a form): a glossary of one dictionary, and its name."""

    name: str = Field(description="the glossary's name")


class DeepLGlossaryV3Request(BaseModel):
    """The body of DeepL's POST /v3/glossaries."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="the glossary's name")
    dictionaries: list[DeepLDictionary] = Field(min_length=1)


class DeepLGlossaryPatch(BaseModel):
    """The body of DeepL's PATCH /v3/glossaries/{id}: a new name, and dictionaries whose entries are merged into
    the glossary's (a new pair's dictionary added)."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    dictionaries: list[DeepLDictionary] | None = None


GLOSSARY_OPENAPI = openapi_body(DeepLGlossaryRequest)
GLOSSARY_V3_OPENAPI = openapi_body(DeepLGlossaryV3Request)
GLOSSARY_PATCH_OPENAPI = openapi_body(DeepLGlossaryPatch)
DICTIONARY_OPENAPI = openapi_body(DeepLDictionary)
Body = TypeVar("Body", bound=BaseModel)


def body_of(model: type[Body], body: dict[str, Any]) -> Body:
    """A glossary route's body as `model` reads it; ApiError invalid_request in DeepL's words where it does not."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        problems = message({"detail": exc.errors()})
        raise ApiError("invalid_request", f"Value for a parameter is not valid: {problems}") from None


DOCUMENT_FIELDS = {
    "target_lang",
    "source_lang",
    "glossary_id",
    "translation_memory_id",
    "translation_memory_threshold",
    "formality",
    "output_format",
    "filename",
}
_LANG = {"type": "string", "minLength": 2, "maxLength": 16}
DOCUMENT_OPENAPI = multipart_body(
    ["file", "target_lang"],
    {
        "file": FILE_FIELD,
        "target_lang": _LANG,
        "source_lang": _LANG,
        "glossary_id": {"type": "string", "description": "needs source_lang"},
        "translation_memory_id": {"type": "string", "description": "a translation memory's id; needs source_lang"},
        "translation_memory_threshold": {
            "type": "integer",
            "minimum": 0,
            "maximum": 100,
            "description": "the least match, in percent, of a memory's unit that answers a segment (default 75)",
        },
        "formality": {"enum": ["default", "prefer_more", "prefer_less"]},
        "output_format": {"enum": sorted(FORMATS), "description": "the file's own"},
        "filename": {"type": "string", "description": "the name whose extension says the format"},
    },
    # DeepL's rule: a glossary, or a translation memory, needs the source named
    dependent={"glossary_id": ["source_lang"], "translation_memory_id": ["source_lang"]},
)


def document_request(form: dict[str, str], filename: str) -> TranslateRequest:
    """The beamserve request a document upload's fields make (DeepL's document options); ApiError
    for one beamserve does not take."""
    unknown = sorted(set(form) - DOCUMENT_FIELDS)
    if unknown:
        raise ApiError("unsupported_option", f"{', '.join(unknown)}: not an option of a document upload")
    wanted = form.get("output_format", "").lower().lstrip(".")
    if wanted and wanted != PurePath(filename).suffix.lower().lstrip("."):
        raise ApiError("unsupported_option", f"output_format {wanted}: a document comes back in its own format")
    body: dict[str, Any] = {"text": ["-"], **{k: v for k, v in form.items() if k in ("target_lang", "source_lang")}}
    if form.get("formality"):
        body["formality"] = form["formality"]
    for field in ("glossary_id", "translation_memory_id", "translation_memory_threshold"):
        if form.get(field):
            body[field] = form[field]
    return parse(body)[1]


def glossary_pairs(pairs: list[str]) -> dict[str, list[dict[str, str]]]:
    """GET /v2/glossary-language-pairs: every pair served (a glossary follows its pair's translations)."""
    keys = ("source_lang", "target_lang")
    return {"supported_languages": [dict(zip(keys, p.split("-"), strict=True)) for p in pairs]}


def response(req: TranslateRequest, out: TranslateResponse) -> DeepLTranslateResponse:
    """DeepL's answer: each text's translation, its source language in DeepL's code, and the characters
    billed for it (its length)."""
    translations = []
    for text, t in zip(req.texts, out.translations, strict=True):
        source = t.detected_source.language if t.detected_source else req.source or ""
        translations.append(
            DeepLTranslation(
                detected_source_language=source.upper(),
                text=t.text,
                billed_characters=len(text),
                confidence=t.confidence,
                origin=t.origin,
                memory_matches=t.memory_matches,
                memory_suggestions=t.memory_suggestions,
            )
        )
    return DeepLTranslateResponse(translations=translations)


def languages(pairs: list[str], kind: str) -> list[DeepLLanguage]:
    """GET /v2/languages?type=source|target over the served pairs."""
    if kind not in ("source", "target"):
        raise ApiError("invalid_request", f"type must be 'source' or 'target', not {kind!r}")
    target = kind == "target"
    codes = sorted({pair.split("-")[1 if target else 0] for pair in pairs})
    return [
        DeepLLanguage(language=d, name=name(c), supports_formality=False if target else None)
        for c in codes
        for d in deepl_codes(c, target=target)
    ]


def error(status: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """An error as DeepL's clients read it: {"message": ...}; 400 for every invalid request (DeepL has
    no 422) and 429 for overload (its clients back off and retry)."""
    code = body.get("error", "")
    status = DEEPL_STATUS.get(code) or (400 if status == 422 else status)
    return status, {"message": message(body), "code": code}
