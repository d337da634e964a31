"""TextCodec: a model's text side without its weights (its tokenizer and the longest source it takes). A
process that turns text into ids and ids into text for a model held in another process holds one of these
(service/engine/engine_process.py); Translator.encode is this codec's."""

from __future__ import annotations

from model.errors import InputTooLongError, check_text
from model.io.tokenizer import Tokenizer


class TextCodec:
    def __init__(self, tokenizer: Tokenizer, max_source_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.max_source_tokens = max_source_tokens

    def encode(self, text: str, *, truncate: bool = False, lang: str | None = None) -> list[int]:
        """Source text -> ids ending in </s>; [] for empty text; `lang`: the source language, where the model
        takes it (Translator.languages). Raises InputTooLongError, InvalidTextError, LanguageError."""
        if not text.strip():
            return []
        check_text(text)
        ids = self.tokenizer.encode(text, lang)
        limit = self.max_source_tokens
        if len(ids) > limit:
            if not truncate:
                raise InputTooLongError(f"source has {len(ids)} tokens; this model accepts at most {limit}")
            ids = self.tokenizer.truncated(ids, limit)
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)
