"""Model hyper-parameters, expressive enough for Marian/OPUS-MT checkpoints."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Activation = Literal["relu", "swish", "gelu"]
# Sinusoidal positions: Marian's (the paper's frequencies, position p at row p), or fairseq's as M2M100 and
# NLLB have them (tensor2tensor's frequencies, position p at row pad_token_id + 1 + p).
Positions = Literal["marian", "fairseq"]


@dataclass(frozen=True)
class ModelConfig:
    """Encoder-decoder Transformer configuration (names follow Marian/Hugging Face)."""

    vocab_size: int  # the source vocabulary (shared with the target unless share_embeddings is off), <pad> included
    decoder_vocab_size: int = 0  # the target vocabulary; 0: the same as vocab_size
    share_embeddings: bool = True  # one embedding for source and target (Marian's share_encoder_decoder_embeddings)
    d_model: int = 512  # width of every residual stream
    encoder_layers: int = 6  # encoder blocks
    decoder_layers: int = 6  # decoder blocks
    encoder_attention_heads: int = 8  # heads in encoder self-attention
    decoder_attention_heads: int = 8  # heads in decoder self- and cross-attention
    encoder_ffn_dim: int = 2048  # inner width of the encoder feed-forward
    decoder_ffn_dim: int = 2048  # inner width of the decoder feed-forward
    activation: Activation = "swish"  # feed-forward non-linearity (OPUS-MT uses swish)
    normalize_before: bool = False  # pre-norm when True; the paper (and Marian) is post-norm
    scale_embedding: bool = True  # multiply embeddings by sqrt(d_model), as in the paper
    tie_embeddings: bool = True  # output projection shares the embedding matrix
    final_logits_bias: bool = True  # a learned bias on the logits (Marian has one)
    max_position_embeddings: int = 512  # longest source or target sequence, in tokens
    positions: Positions = "marian"  # the sinusoids' layout (Positions)
    pad_token_id: int = -1  # -1 means the last vocabulary entry (the Marian convention)
    eos_token_id: int = 0  # end of sentence, appended to every source
    unk_token_id: int = 1  # unknown piece
    decoder_start_token_id: int = -1  # first decoder input; Marian uses the pad token
    forced_eos_token_id: int | None = 0  # token forced at the last allowed step (Marian: eos)
    dropout: float = 0.1  # residual and embedding dropout (training only)
    attention_dropout: float = 0.0  # dropout on attention probabilities (training only)
    activation_dropout: float = 0.0  # dropout after the feed-forward activation (training only)
    layer_norm_eps: float = 1e-5  # LayerNorm epsilon

    def __post_init__(self) -> None:
        # Resolve the -1 and 0 conventions once, so every consumer sees real ids and sizes.
        if self.decoder_vocab_size <= 0:
            object.__setattr__(self, "decoder_vocab_size", self.vocab_size)
        if self.share_embeddings and self.decoder_vocab_size != self.vocab_size:
            raise ValueError(
                f"a shared embedding needs one vocabulary: vocab_size {self.vocab_size}, "
                f"decoder_vocab_size {self.decoder_vocab_size}"
            )
        if self.pad_token_id < 0:
            object.__setattr__(self, "pad_token_id", self.vocab_size - 1)
        if self.decoder_start_token_id < 0:
            object.__setattr__(self, "decoder_start_token_id", self.pad_token_id)
        for name in ("encoder_attention_heads", "decoder_attention_heads"):
            if self.d_model % getattr(self, name):
                raise ValueError(f"d_model={self.d_model} is not divisible by {name}={getattr(self, name)}")
        # Marian pads both sides with one id and starts the decoder on it: it must be a target id too.
        if max(self.pad_token_id, self.decoder_start_token_id) >= self.decoder_vocab_size:
            raise ValueError(f"pad and decoder start ids must be below decoder_vocab_size {self.decoder_vocab_size}")
        if self.activation not in ("relu", "swish", "gelu"):
            raise ValueError(f"activation must be relu, swish or gelu, not {self.activation!r}")
        if self.positions not in ("marian", "fairseq"):
            raise ValueError(f"positions must be marian or fairseq, not {self.positions!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown ModelConfig fields: {sorted(unknown)}")
        return cls(**data)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> ModelConfig:
        return cls.from_dict(json.loads(path.read_text()))


def preset(name: str, vocab_size: int) -> ModelConfig:
    """Named sizes: `tiny` for tests, `small` for the shipped Multi30k models, `base` = OPUS-MT."""
    presets: dict[str, dict[str, Any]] = {
        "tiny": dict(
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
        ),
        "small": dict(
            d_model=256,
            encoder_layers=3,
            decoder_layers=3,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=1024,
            decoder_ffn_dim=1024,
        ),
        "base": dict(
            d_model=512,
            encoder_layers=6,
            decoder_layers=6,
            encoder_attention_heads=8,
            decoder_attention_heads=8,
            encoder_ffn_dim=2048,
            decoder_ffn_dim=2048,
        ),
    }
    if name not in presets:
        raise ValueError(f"unknown preset {name!r}; choose from {sorted(presets)}")
    return ModelConfig(vocab_size=vocab_size, **presets[name])
