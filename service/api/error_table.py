"""Each error code's status and meaning with the limits it states filled in from the constants that enforce
them (service/error_codes.py names them): docs/operations.md's table of errors is this one, tested."""

from __future__ import annotations

from service.api import front
from service.error_codes import CODES
from service.store import memories
from service.text import documents, glossary, ooxml_text, tmx

LIMITS: dict[str, object] = {
    "FORMATS": ", ".join(f".{k}" for k in documents.FORMATS),
    "MAX_GLOSSARIES": glossary.MAX_GLOSSARIES,
    "MAX_ENTRIES": glossary.MAX_ENTRIES,
    "MAX_ENTRIES_CHARS": glossary.MAX_ENTRIES_CHARS,
    "MAX_MEMORIES": memories.MAX_MEMORIES,
    "MAX_SEGMENT_CHARS": memories.MAX_SEGMENT_CHARS,
    "MAX_UNITS": tmx.MAX_UNITS,
    "MAX_TMX_ELEMENTS": tmx.MAX_ELEMENTS,
    "MAX_CHARACTERS": documents.MAX_CHARACTERS,
    "MAX_XML_BYTES": ooxml_text.MAX_XML_BYTES,
    "MAX_ELEMENTS": ooxml_text.MAX_ELEMENTS,
    "MAX_URL_BYTES": front.MAX_URL_BYTES,
    "MAX_HEADERS": front.MAX_HEADERS,
    "MAX_HEADER_BYTES": front.MAX_HEADER_BYTES,
}


def described() -> dict[str, tuple[int, str]]:
    """Error code -> (its HTTP status, what it means, limits as numbers)."""
    return {code: (status, meaning.format(**LIMITS)) for code, (status, meaning) in CODES.items()}
