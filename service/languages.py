"""Names of the languages beamserve's routes list, by ISO 639-1 code (a code not here is its own name)."""

NAMES = {"en": "English", "de": "German", "fr": "French", "es": "Spanish", "it": "Italian", "cs": "Czech"}


def name(code: str) -> str:
    return NAMES.get(code, code)
