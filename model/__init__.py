"""beamserve's model: an encoder-decoder Transformer, search, tokenization, checkpoints, training."""

from model.config import ModelConfig
from model.translator import DecodeOptions, InputTooLongError, InvalidTextError, TranslationResult, Translator

__all__ = [
    "DecodeOptions", "InputTooLongError", "InvalidTextError", "ModelConfig", "TranslationResult", "Translator",
]
