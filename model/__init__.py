"""beamserve's model: an encoder-decoder Transformer, search, tokenization, checkpoints, training."""

from model.config import ModelConfig
from model.translator import (
    DecodeOptions,
    InputTooLongError,
    InvalidTextError,
    SourceError,
    TranslationResult,
    Translator,
)

__all__ = [
    "DecodeOptions", "InputTooLongError", "InvalidTextError", "ModelConfig", "SourceError", "TranslationResult",
    "Translator",
]
