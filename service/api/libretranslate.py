"""LibreTranslate's POST /translate: its request body (JSON or form; q a string or a list;
alternatives; format text or html) read into beamserve's request, and its response shape."""

import json
import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from service.api.bodies import multipart_body, openapi_body
from service.errors import ApiError, message
from service.schemas import DetectedLanguage, MemoryRef, MemorySuggestion, TranslateRequest, TranslateResponse
from service.text.detect import Detected
from service.text.documents import FILE_FIELD, FORMATS
from service.text.languages import name


class LibreDetectRequest(BaseModel):
    """The body of LibreTranslate's POST /detect (JSON or a form, q repeated for a list)."""

    q: str | Annotated[list[str], Field(min_length=1)] = Field(description="a text, or a list of texts")
    api_key: str | None = Field(None, description="the client's key, when the server requires keys")


class LibreTranslateRequest(LibreDetectRequest):
    """The body of LibreTranslate's POST /translate: /detect's, and the languages and options."""

    model_config = ConfigDict(
        json_schema_extra={  # beamserve's rule: a translation memory needs the source language named
            "if": {"properties": {"memory": {"not": {"type": "null"}}}, "required": ["memory"]},
            "then": {"properties": {"source": {"not": {"enum": ["auto"]}}}},
        }
    )

    source: str = Field(description="a language code, or auto (detected per text)", examples=["en"])
    target: str = Field(examples=["de"])
    format: Literal["text", "html"] = "text"
    alternatives: int = Field(0, ge=0, description="extra translations per text")
    memory: str | MemoryRef | None = Field(
        None, description="beamserve's: a translation memory's id, or {id, min_match} (as /v1's memory)"
    )


class LibreDetected(BaseModel):
    confidence: float  # percent
    language: str


class LibreTranslateResponse(BaseModel):
    translatedText: str | list[str]  # noqa: N815 (LibreTranslate's name)
    alternatives: list[str] | list[list[str]] | None = None
    detectedLanguage: LibreDetected | list[LibreDetected] | None = None  # noqa: N815
    # beamserve's: the model's confidence in each translation (as /v1's); LibreTranslate's clients ignore it
    confidence: float | list[float | None] | None = None
    # beamserve's, with a translation memory: where each translation's sentences came from (as /v1's)
    origin: str | list[str | None] | None = None
    memory_matches: list[float | None] | list[list[float | None] | None] | None = None
    # beamserve's, with a translation memory: the units near a sentence that did not answer it (as /v1's)
    memory_suggestions: list[MemorySuggestion | None] | list[list[MemorySuggestion | None] | None] | None = None


OPENAPI = openapi_body(LibreTranslateRequest)  # Mastodon sends JSON, other clients forms
DETECT_OPENAPI = openapi_body(LibreDetectRequest)


def form_field(name: str, values: list[str]) -> Any:
    """A form field's value: q given several times is a list."""
    return values if name == "q" and len(values) > 1 else values[0]


def texts_of(body: dict[str, Any]) -> tuple[list[str], bool]:
    """q as a list of texts, and whether it was one string (the answer is one too)."""
    q = body.get("q")
    texts = [q] if isinstance(q, str) else q
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise ApiError("invalid_request", "q must be a non-empty string or list of strings")
    return texts, isinstance(q, str)


def languages_of(body: dict[str, Any]) -> tuple[str, str]:
    """LibreTranslate's source ("auto" to detect) and target, each a string as sent."""
    out = []
    for field, wanted in (("source", "a language code or 'auto'"), ("target", "a language code")):
        value = body.get(field)
        if not isinstance(value, str) or not value.strip():
            raise ApiError(
                "invalid_request", f"{field} must be {wanted}, not {json.dumps(value, ensure_ascii=False)[:100]}"
            )
        out.append(value)
    return out[0], out[1]


def alternatives(body: dict[str, Any]) -> int:
    """LibreTranslate's `alternatives`: an integer, in JSON or as a form's string of ASCII digits."""
    value = body.get("alternatives")
    if value is None or value == "":
        return 0
    if isinstance(value, str) and value.isascii() and value.strip().isdigit():
        return int(value)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ApiError(
        "invalid_request", f"alternatives must be an integer, not {json.dumps(value, ensure_ascii=False)[:100]}"
    )


def request_of(body: dict[str, Any], max_beam_size: int) -> TranslateRequest:
    """The native request a LibreTranslate body asks for (its texts, "auto" as a detected source, its
    alternatives as n-best hypotheses, format html as tag_handling); ApiError for what LibreTranslate refuses."""
    texts, _ = texts_of(body)
    source, target = languages_of(body)
    if body.get("format", "text") not in ("text", "html"):
        raise ApiError("invalid_request", "format must be 'text' or 'html'")
    extra = alternatives(body)
    if not 0 <= extra < max_beam_size:
        raise ApiError("invalid_request", f"alternatives must be between 0 and {max_beam_size - 1}")
    try:
        return TranslateRequest.model_validate(
            {
                "texts": texts,
                "source": source,
                "target": target,
                # alternatives: that many more hypotheses, from a beam at least as wide; none: the model's beam
                **({"beam_size": max(4, extra + 1), "num_hypotheses": extra + 1} if extra else {}),
                "tag_handling": "html" if body.get("format") == "html" else None,
                **({"memory": body["memory"]} if body.get("memory") is not None else {}),
            }
        )
    except ValidationError as exc:
        raise ApiError("invalid_request", message({"detail": exc.errors()})) from None


def detected_language(found: Detected | DetectedLanguage) -> dict[str, Any]:
    """LibreTranslate's {"confidence", "language"}, the confidence in percent."""
    return {"confidence": round(found.confidence * 100, 1), "language": found.language}


# Where errors are answered in LibreTranslate's shape.
ROUTES = frozenset({"/translate", "/detect", "/frontend/settings", "/translate_file"})


def error(path: str, status: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """An error as answered on `path`: as it is, except on LibreTranslate's route, as its clients read
    it: {"error": message} (Mastodon and the web client show that string), 400 for every invalid
    request (LibreTranslate has no 422), and 429 for overload, which they take as "slow down"."""
    if path not in ROUTES:
        return status, body
    out = {"error": message(body), "code": body.get("error", "")}
    return (429 if body.get("error") == "overloaded" else 400 if status == 422 else status), out


def response(single: bool, extra: int, answer: TranslateResponse) -> dict[str, Any]:
    """{"translatedText", "alternatives", "detectedLanguage"} from the native answer's n-best translations,
    best first; each a string or object when q was one string, else a list."""

    def shaped(values: list[Any]) -> Any:
        return values[0] if single else values

    nbest = [t.hypotheses or [t.text] for t in answer.translations]
    result: dict[str, Any] = {"translatedText": shaped([n[0] for n in nbest])}
    if extra:
        result["alternatives"] = shaped([n[1:] for n in nbest])
    detected = [t.detected_source for t in answer.translations]
    if all(d is not None for d in detected):
        result["detectedLanguage"] = shaped([detected_language(d) for d in detected if d is not None])
    sure = [t.confidence for t in answer.translations]
    if any(c is not None for c in sure):
        result["confidence"] = shaped(sure)
    if any(t.origin is not None for t in answer.translations):
        result["origin"] = shaped([t.origin for t in answer.translations])
        result["memory_matches"] = shaped([t.memory_matches for t in answer.translations])
        result["memory_suggestions"] = shaped(
            [[s.model_dump() if s else None for s in t.memory_suggestions or []] for t in answer.translations]
        )
    return result


def frontend_settings(char_limit: int, targets: list[str], *, keys: bool) -> dict[str, Any]:
    """GET /frontend/settings as LibreTranslate answers it: limits, whether keys are needed, the
    languages its web client starts with."""
    target = targets[0] if targets else "en"
    return {
        "charLimit": char_limit,
        "frontendTimeout": 500,
        "apiKeys": keys,
        "keyRequired": keys,
        "suggestions": False,
        "filesTranslation": True,
        "supportedFilesFormat": sorted(f".{k}" for k in FORMATS),
        "language": {
            "source": {"code": "auto", "name": "Auto Detect"},
            "target": {"code": target, "name": name(target)},
        },
    }


FILE_OPENAPI = multipart_body(
    ["file", "source", "target"],
    {
        "file": FILE_FIELD,
        "source": {"type": "string", "description": "a language code, or auto"},
        "target": {"type": "string"},
        "api_key": {"type": "string"},
        "memory": {"type": "string", "description": "beamserve's: a translation memory's id; needs the source named"},
    },
)


def file_request(fields: dict[str, str]) -> TranslateRequest:
    """The request a /translate_file upload's fields make; ApiError for a missing or unknown field."""
    unknown = sorted(set(fields) - {"source", "target", "api_key", "memory"})
    if unknown:
        raise ApiError("invalid_request", f"{', '.join(unknown)}: not a field of /translate_file")
    source = fields.get("source", "auto").strip().lower()
    try:
        return TranslateRequest(
            texts=["-"],
            source=None if source == "auto" else source,
            target=fields.get("target", ""),
            memory=fields.get("memory") or None,
        )
    except ValidationError as exc:
        raise ApiError("invalid_request", message({"detail": exc.errors()})) from None
