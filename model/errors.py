"""Errors about a source text that the library raises and the service answers as 422 (torch-free)."""

from __future__ import annotations


class SourceError(ValueError):
    """A source text the model cannot take; `index` is its place among the texts given to translate()."""

    def __init__(self, reason: str, index: int | None = None) -> None:
        super().__init__(reason)
        self.reason, self.index = reason, index

    def __str__(self) -> str:
        return self.reason if self.index is None else f"texts[{self.index}]: {self.reason}"

    def __reduce__(self) -> tuple[type[SourceError], tuple[str, int | None]]:
        return type(self), (self.reason, self.index)  # keeps the index across processes (Ray, workers)


class InputTooLongError(SourceError):
    """A source sentence has more tokens than the model accepts (and truncation was not asked for)."""


class InvalidTextError(SourceError):
    """A source text that is not valid Unicode: a lone surrogate, which no UTF-8 tokenizer can take."""


def check_text(text: str) -> None:
    """Raise InvalidTextError when text cannot be encoded as UTF-8 (JSON's "\\ud800" decodes to such a str)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        # Python decodes bytes that are not UTF-8 to U+DC80-U+DCFF under errors="surrogateescape" (stdin, often).
        byte = f" (byte 0x{code - 0xDC00:02x} of input that is not UTF-8)" if 0xDC80 <= code <= 0xDCFF else ""
        raise InvalidTextError(
            f"character {exc.start} is a lone surrogate U+{code:04X}{byte}: not valid Unicode"
        ) from None
