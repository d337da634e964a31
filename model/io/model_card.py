"""A model directory's licence, as its model card states it: the `license` of the YAML front matter of
README.md (the Hugging Face hub's card) or MODEL_CARD.md (beamserve's shipped models), `license_name`
where the licence is `other`. Read as the few lines it is, without a YAML parser (model/ needs none).
NLLB-200's weights are CC-BY-NC-4.0, OPUS-MT's CC-BY-4.0: an operator is told which, and warned of a
licence that forbids commercial use."""

from __future__ import annotations

import re
from pathlib import Path

CARDS = ("README.md", "MODEL_CARD.md")
_FIELD = re.compile(r"^(license|license_name):[ \t]*(.*?)[ \t]*$")
_ITEM = re.compile(r"^[ \t]*-[ \t]+(.+?)[ \t]*$")


def licence(directory: Path) -> str | None:
    """The licence the directory's model card names, else None."""
    for name in CARDS:
        card = directory / name
        if card.is_file():
            found = _front_matter_licence(card.read_text(encoding="utf-8", errors="replace"))
            if found:
                return found
    return None


def non_commercial(licence: str | None) -> bool:
    """Whether the licence forbids commercial use (Creative Commons' NC licences, and any that says so)."""
    text = (licence or "").lower()
    return bool(re.search(r"(^|[-_ ])nc([-_ ]|$)", text)) or "non-commercial" in text or "noncommercial" in text


def _front_matter_licence(text: str) -> str | None:
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return None
    fields: dict[str, str] = {}
    key = None
    for line in lines[1:]:
        if line.strip() == "---":
            break
        if (m := _FIELD.match(line)) is not None:
            key, value = m.group(1), _unquoted(m.group(2))
            if value:
                fields[key] = value
        elif key is not None and key not in fields and (item := _ITEM.match(line)) is not None:
            fields[key] = _unquoted(item.group(1))  # a list: its first item
        elif line[:1] not in (" ", "\t", "-"):
            key = None
    found = fields.get("license")
    if found == "other" and fields.get("license_name"):
        return f"other: {fields['license_name']}"
    return found


def _unquoted(value: str) -> str:
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"" else value
