"""The OpenAPI document as this server answers: the request bodies' bounds and language codes are its
settings' and its served languages', not only the types'.

FastAPI builds the document from the routes' models, which know a field's type but not this server's
max_texts, max_text_chars or max_beam_size, nor which languages it serves (max_decoding_length is
capped, not refused, so the document leaves it unbounded). A
gateway replica sets `served(...)` as the app's `openapi`, so a client generated from the document,
or a fuzzer reading it, gets the limits the server will hold it to. One rule stays out of the
document: a pair is a combination (en -> de may be served and de -> fr not); each side's codes are
listed, and an unserved combination is a 400 `unsupported_pair` naming the served pairs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from service.api.deepl import deepl_codes

if TYPE_CHECKING:
    from fastapi import FastAPI

    from service.settings import Settings

# Values a compatible API's clients may send that beamserve refuses with a 400 saying why (DeepL's).
REFUSED_VALUES = {"tag_handling": {"xml"}, "formality": {"more", "less"}}


def served(app: FastAPI, settings: Settings, languages: frozenset[str]) -> Callable[[], dict[str, Any]]:
    """The app's `openapi` function: FastAPI's document, with every request body bounded as served."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = bound(original(), settings, languages)
        return app.openapi_schema

    original = app.openapi
    return openapi


def bound(document: dict[str, Any], s: Settings, languages: frozenset[str]) -> dict[str, Any]:
    """document with each request body's fields bounded by the settings and served languages, in place."""
    codes = sorted(languages)
    limits: dict[str, dict[str, Any]] = {
        "beam_size": {"maximum": s.max_beam_size},
        "num_hypotheses": {"maximum": s.max_beam_size},
        "alternatives": {"maximum": s.max_beam_size - 1},
        "target": {"enum": codes},
        # DeepL's codes, upper case; English and Portuguese targets with their variants.
        "source_lang": {"enum": [c.upper() for c in codes]},
        "target_lang": {"enum": sorted({d for c in codes for d in [c.upper(), *deepl_codes(c, target=True)]})},
    }
    for properties in _bodies(document):
        for name, field in properties.items():
            for option in _options(field):
                if name in limits and option.get("type") in ("integer", "string"):
                    option.update(limits[name])
                elif name == "source" and option.get("type") == "string":
                    # Omitted, null or "auto": detected (LibreTranslate's clients send "auto").
                    option["enum"] = [*codes, "auto"]
                elif name in ("texts", "q", "text", "translations"):
                    _bound_texts(option, s)
                if name in REFUSED_VALUES and "enum" in option:
                    option["enum"] = [v for v in option["enum"] if v not in REFUSED_VALUES[name]]
    return document


def _bound_texts(option: dict[str, Any], s: Settings) -> None:
    if option.get("type") == "array":
        option["maxItems"] = s.max_texts
        option.setdefault("items", {})["maxLength"] = s.max_text_chars
    elif option.get("type") == "string":
        option["maxLength"] = s.max_text_chars


def _bodies(document: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Each request body schema's properties (JSON and form alike)."""
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            content = operation.get("requestBody", {}).get("content", {}) if isinstance(operation, dict) else {}
            for media in content.values():
                schema = media.get("schema", {})
                if "$ref" in schema:
                    schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
                yield schema.get("properties", {})


def _options(field: dict[str, Any]) -> list[dict[str, Any]]:
    """A field's schema, or each alternative of an anyOf (`X | None`, `str | list[str]`)."""
    options: list[dict[str, Any]] = field.get("anyOf", [field])
    return options
