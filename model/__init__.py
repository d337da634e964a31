"""beamserve's model: an encoder-decoder Transformer, search, tokenization, checkpoints, training.

The options and errors import without torch (the service's gateway and scheduler use them); the rest
loads on first use.
"""

from typing import TYPE_CHECKING, Any

from model.errors import InputTooLongError, InvalidTextError, SourceError
from model.options import DecodeOptions

if TYPE_CHECKING:
    from model.nn.config import ModelConfig
    from model.translator import TranslationResult, Translator

_LAZY = {"ModelConfig": "model.nn.config", "TranslationResult": "model.translator", "Translator": "model.translator"}

__all__ = [
    "DecodeOptions",
    "InputTooLongError",
    "InvalidTextError",
    "ModelConfig",
    "SourceError",
    "TranslationResult",
    "Translator",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'model' has no attribute {name!r}")
