"""The API's language codes for a multilingual model's language tokens, and back.

The API names a language as ISO 639-1 where it has a code there, else ISO 639-3 (service/text/languages.py).
NLLB-200's tokens are FLORES-200 codes, an ISO 639-3 code and a script ("eng_Latn", "zho_Hans"); M2M100's
are the API's codes already ("__en__" holds "en"). An NLLB language whose usual two-letter code belongs to
its macrolanguage (Standard Arabic "arb" is Arabic "ar") takes that code; where NLLB has a language in two
scripts, the code goes to the script most text is written in (DEFAULT_SCRIPTS), and a registry entry's
`language_tokens` can give the other one a code of its own ({"zt": "zho_Hant"}). Torch-free: the serve
driver resolves a registry entry's languages with it.
"""

from __future__ import annotations

import re

FLORES = re.compile(r"^([a-z]{3})_([A-Z][a-z]{3})$")

# ISO 639-3 -> ISO 639-1, every language that has both (Debian's iso-codes).
# fmt: off
ALPHA2 = {
    "aar": "aa", "abk": "ab", "afr": "af", "aka": "ak", "amh": "am", "ara": "ar", "arg": "an", "asm": "as",
    "ava": "av", "ave": "ae", "aym": "ay", "aze": "az", "bak": "ba", "bam": "bm", "bel": "be", "ben": "bn",
    "bis": "bi", "bod": "bo", "bos": "bs", "bre": "br", "bul": "bg", "cat": "ca", "ces": "cs", "cha": "ch",
    "che": "ce", "chu": "cu", "chv": "cv", "cor": "kw", "cos": "co", "cre": "cr", "cym": "cy", "dan": "da",
    "deu": "de", "div": "dv", "dzo": "dz", "ell": "el", "eng": "en", "epo": "eo", "est": "et", "eus": "eu",
    "ewe": "ee", "fao": "fo", "fas": "fa", "fij": "fj", "fin": "fi", "fra": "fr", "fry": "fy", "ful": "ff",
    "gla": "gd", "gle": "ga", "glg": "gl", "glv": "gv", "grn": "gn", "guj": "gu", "hat": "ht", "hau": "ha",
    "hbs": "sh", "heb": "he", "her": "hz", "hin": "hi", "hmo": "ho", "hrv": "hr", "hun": "hu", "hye": "hy",
    "ibo": "ig", "ido": "io", "iii": "ii", "iku": "iu", "ile": "ie", "ina": "ia", "ind": "id", "ipk": "ik",
    "isl": "is", "ita": "it", "jav": "jv", "jpn": "ja", "kal": "kl", "kan": "kn", "kas": "ks", "kat": "ka",
    "kau": "kr", "kaz": "kk", "khm": "km", "kik": "ki", "kin": "rw", "kir": "ky", "kom": "kv", "kon": "kg",
    "kor": "ko", "kua": "kj", "kur": "ku", "lao": "lo", "lat": "la", "lav": "lv", "lim": "li", "lin": "ln",
    "lit": "lt", "ltz": "lb", "lub": "lu", "lug": "lg", "mah": "mh", "mal": "ml", "mar": "mr", "mkd": "mk",
    "mlg": "mg", "mlt": "mt", "mon": "mn", "mri": "mi", "msa": "ms", "mya": "my", "nau": "na", "nav": "nv",
    "nbl": "nr", "nde": "nd", "ndo": "ng", "nep": "ne", "nld": "nl", "nno": "nn", "nob": "nb", "nor": "no",
    "nya": "ny", "oci": "oc", "oji": "oj", "ori": "or", "orm": "om", "oss": "os", "pan": "pa", "pli": "pi",
    "pol": "pl", "por": "pt", "pus": "ps", "que": "qu", "roh": "rm", "ron": "ro", "run": "rn", "rus": "ru",
    "sag": "sg", "san": "sa", "sin": "si", "slk": "sk", "slv": "sl", "sme": "se", "smo": "sm", "sna": "sn",
    "snd": "sd", "som": "so", "sot": "st", "spa": "es", "sqi": "sq", "srd": "sc", "srp": "sr", "ssw": "ss",
    "sun": "su", "swa": "sw", "swe": "sv", "tah": "ty", "tam": "ta", "tat": "tt", "tel": "te", "tgk": "tg",
    "tgl": "tl", "tha": "th", "tir": "ti", "ton": "to", "tsn": "tn", "tso": "ts", "tuk": "tk", "tur": "tr",
    "twi": "tw", "uig": "ug", "ukr": "uk", "urd": "ur", "uzb": "uz", "ven": "ve", "vie": "vi", "vol": "vo",
    "wln": "wa", "wol": "wo", "xho": "xh", "yid": "yi", "yor": "yo", "zha": "za", "zho": "zh", "zul": "zu",
}
# fmt: on

# Individual languages NLLB names whose usual two-letter code is their macrolanguage's.
MACROLANGUAGE = {
    "arb": "ar", "zsm": "ms", "pes": "fa", "khk": "mn", "lvs": "lv", "npi": "ne", "plt": "mg", "uzn": "uz",
    "swh": "sw", "ydd": "yi", "gaz": "om", "azj": "az", "als": "sq", "quy": "qu", "pbt": "ps", "ory": "or",
    "ayr": "ay", "kmr": "ku", "knc": "kr",
}  # fmt: skip

# The script a language's plain code means, of those written in more than one: the one that takes the API's
# code where NLLB has the language in two, and what a client's tag without a script means
# (service/text/language_tags.py).
DEFAULT_SCRIPTS = {
    "zh": "Hans", "ace": "Latn", "bjn": "Latn", "ks": "Arab", "kr": "Latn", "taq": "Latn", "sr": "Cyrl",
    "uz": "Latn", "az": "Latn", "pa": "Guru", "mn": "Cyrl", "ms": "Latn", "bs": "Latn", "sd": "Arab", "ku": "Latn",
    "tt": "Cyrl", "kk": "Cyrl", "ky": "Cyrl",
}  # fmt: skip


def api_code(code: str) -> str:
    """The API's code of a model's language code (eng_Latn -> en, de -> de)."""
    m = FLORES.match(code)
    if m is None:
        return code
    three = m.group(1)
    return MACROLANGUAGE.get(three) or ALPHA2.get(three) or three


def api_languages(codes: list[str]) -> dict[str, str]:
    """The API's code -> the model's, for every language of a model (its language tokens' codes); of a
    language in two scripts, the default script's."""
    out: dict[str, str] = {}
    for code in sorted(codes):
        api = api_code(code)
        m = FLORES.match(code)
        script = m.group(2) if m else None
        if api not in out or script == DEFAULT_SCRIPTS.get(api):
            out[api] = code
    return out
