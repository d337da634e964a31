"""A language as a client names it (a BCP 47 tag: `pt-BR`, `zh-Hant`, `ZH-HANT`, `sr-Latn`, `zh_TW`; an
ISO 639-3 code: `deu`) -> the API's code of a served language (service/text/language_codes.py says which).

A region goes (`pt-BR` is `pt`, `en-GB` is `en`); a script stays where the language is written in more
than one: Traditional Chinese is `zt` (LibreTranslate's code, and the one a registry entry gives
`zho_Hant`), named by `zh-Hant`, or by a region that writes it (`zh-TW`, `zh-HK`, `zh-MO`); a script with
no served code of its own is refused by name, never folded into the language's other script.
"""

from __future__ import annotations

from collections.abc import Collection

from service.errors import ApiError
from service.text.language_codes import ALPHA2, DEFAULT_SCRIPTS
from service.text.languages import name as language_name

# A script's own API code where it is not the default one.
SCRIPT_CODES = {("zh", "Hant"): "zt"}
# Regions whose usual script is not the language's default.
REGION_SCRIPTS = {("zh", "TW"): "Hant", ("zh", "HK"): "Hant", ("zh", "MO"): "Hant"}


def served_code(tag: str, served: Collection[str]) -> str:
    """The API's code for `tag`: itself where it is served as written (case aside), else its language (and
    script) as above. ApiError unsupported_pair for a script the server has no code for."""
    lowered = tag.strip().lower()
    if lowered in served or lowered == "auto":
        return lowered
    parts = lowered.replace("_", "-").split("-")
    lang = ALPHA2.get(parts[0], parts[0])
    script = next((p.title() for p in parts[1:] if len(p) == 4 and p.isalpha()), None)
    region = next((p.upper() for p in parts[1:] if len(p) == 2 and p.isalpha()), None)
    script = script or REGION_SCRIPTS.get((lang, region or ""))
    if script is None or script == DEFAULT_SCRIPTS.get(lang, script):
        return lang
    code = SCRIPT_CODES.get((lang, script))
    if code is None or code not in served:
        raise ApiError(
            "unsupported_pair",
            f"{tag}: no model for {language_name(lang)} ({lang}) in the {script} script"
            + (f" (served: {lang}, in {DEFAULT_SCRIPTS[lang]})" if lang in DEFAULT_SCRIPTS and lang in served else ""),
        )
    return code
