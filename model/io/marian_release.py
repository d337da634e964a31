"""Marian's own release format (OPUS-MT and Tatoeba Challenge zips) -> a Hugging Face MarianMT directory.

A release directory holds `decoder.yml` (which .npz file is the model, which .vocab.yml files are its
vocabularies), the .npz (every parameter under Marian's name, its architecture as YAML in
"special:model.yml"), `source.spm` and `target.spm`. The conversion is the one Hugging Face's Marian
models were made with: weight matrices transposed (Marian multiplies x @ W), vectors squeezed, `<pad>`
appended to the vocabulary with a zero embedding row and logits bias, the decoder started on it.
Models with one vocabulary and all embeddings tied (OPUS-MT's and the Tatoeba Challenge's transformer
models) are converted; other Marian set-ups are refused by name.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from safetensors.torch import save_file

CONFIG_KEY = "special:model.yml"
# Marian's names for a layer's parts -> Hugging Face's, within encoder_l{i}_ / decoder_l{i}_.
_ATTENTION = {
    "Wq": "q_proj.weight",
    "bq": "q_proj.bias",
    "Wk": "k_proj.weight",
    "bk": "k_proj.bias",
    "Wv": "v_proj.weight",
    "bv": "v_proj.bias",
    "Wo": "out_proj.weight",
    "bo": "out_proj.bias",
}
_FFN = {"W1": "fc1.weight", "b1": "fc1.bias", "W2": "fc2.weight", "b2": "fc2.bias"}
# (Marian's block in a layer, Hugging Face's module, its LayerNorm)
_ENCODER_BLOCKS = [("self", "self_attn", "self_attn_layer_norm")]
_DECODER_BLOCKS = [
    ("self", "self_attn", "self_attn_layer_norm"),
    ("context", "encoder_attn", "encoder_attn_layer_norm"),
]


def read_config(weights: Any) -> dict[str, Any]:
    """The architecture Marian stored beside the weights (YAML, a trailing NUL)."""
    raw = bytes(weights[CONFIG_KEY]).rstrip(b"\0")
    try:
        config = yaml.safe_load(raw.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"the release's {CONFIG_KEY} is not YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(config, dict):
        raise ValueError(f"the release's {CONFIG_KEY} is not a mapping of options")
    return config


def read_vocab(path: Path) -> dict[str, int]:
    """A Marian .vocab.yml (piece: id) as a dict; `<pad>` added after the last id, as Hugging Face's are.
    Every key stays the string it is (YAML's base schema): a piece spelt `no`, `null` or `1` is not a
    boolean, a None or a number."""
    raw = yaml.load(path.read_text(encoding="utf-8"), Loader=yaml.BaseLoader)  # builds no objects
    if not isinstance(raw, dict) or "</s>" not in raw:
        raise ValueError(f"{path.name} is not a Marian vocabulary (piece: id lines with </s>)")
    vocab = {str(k): int(v) for k, v in raw.items()}
    vocab.setdefault("<pad>", max(vocab.values()) + 1)
    return vocab


def _check(config: dict[str, Any], weights: Any, vocabs: list[str]) -> None:
    problems = []
    if config.get("type", "transformer") != "transformer":
        problems.append(f"type {config.get('type')!r} (a transformer is needed)")
    if config.get("transformer-decoder-autoreg", "self-attention") != "self-attention":
        problems.append(f"a {config['transformer-decoder-autoreg']} decoder (self-attention is needed)")
    depths = (config.get("transformer-ffn-depth", 2), config.get("transformer-decoder-ffn-depth", 0) or 2)
    if any(int(d) != 2 for d in depths):
        problems.append(f"feed-forward blocks of depth {depths} (2 is needed)")
    if str(config.get("transformer-preprocess", "")) != "" or config.get("transformer-postprocess", "dan") != "dan":
        problems.append("a pre-norm transformer (--transformer-preprocess n)")
    if not config.get("tied-embeddings-all", False) or len(set(vocabs)) != 1 or "Wemb" not in weights:
        problems.append("separate source and target vocabularies or embeddings")
    if "n" in str(config.get("transformer-postprocess-emb", "d")):
        problems.append("a LayerNorm on the embeddings (--transformer-postprocess-emb n)")
    if problems:
        raise ValueError("this Marian model uses what the conversion does not support: " + "; ".join(problems))


class Tensors:
    """The release's .npz, each name read noted: a name that is not there is a ValueError saying so."""

    def __init__(self, npz: Any) -> None:
        self.npz, self.read = npz, {CONFIG_KEY}

    def __contains__(self, name: str) -> bool:
        return name in self.npz.files

    def __getitem__(self, name: str) -> Any:
        if name not in self.npz.files:
            raise ValueError(f"the release has no tensor {name!r}, which its model.yml's architecture needs")
        self.read.add(name)
        return self.npz[name]

    def unread(self) -> list[str]:
        return sorted(set(self.npz.files) - self.read)


def _release_files(release: Path) -> tuple[Path, list[Path]]:
    """decoder.yml's model file and vocabularies; ValueError or FileNotFoundError naming what is wrong."""
    found = release / "decoder.yml"
    if not found.is_file():
        raise FileNotFoundError(f"{release} is not a Marian release: no decoder.yml")
    try:
        decoder = yaml.safe_load(found.read_text(encoding="utf-8"))
        model, vocabs = decoder["models"][0], decoder["vocabs"]
    except (yaml.YAMLError, KeyError, IndexError, TypeError) as exc:
        why = " ".join(str(exc).split())  # YAML's message spans lines
        raise ValueError(f"{found} does not name the model and vocabularies (models:, vocabs:): {why}") from None
    paths = [release / model, *(release / v for v in vocabs)]
    for path in (*paths, release / "source.spm", release / "target.spm"):
        if not path.is_file():
            raise FileNotFoundError(f"the release has no {path.name} (named by decoder.yml or needed beside it)")
    return paths[0], paths[1:]


def convert(release: Path, out: Path) -> None:
    """Write the Hugging Face MarianMT directory of the release in `release` to `out`. Every tensor of the
    release is placed or the conversion is refused, naming those it cannot place (a model missing one would
    translate wrongly, silently); every failure is a ValueError or FileNotFoundError saying what."""
    model, vocab_files = _release_files(release)
    try:
        npz = np.load(model)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{model.name} is not a readable .npz: {exc}") from None
    weights = Tensors(npz)
    if CONFIG_KEY not in weights:
        raise ValueError(f"{model.name} holds no architecture ({CONFIG_KEY})")
    config = read_config(weights)
    _check(config, weights, [v.name for v in vocab_files])
    vocab = read_vocab(vocab_files[0])
    try:
        state = _hf_state(weights, config)
        hf_config = _hf_config(config, vocab)
    except KeyError as exc:
        raise ValueError(f"the release's model.yml lacks {exc} for its architecture") from None
    left = weights.unread()
    if left:
        raise ValueError(
            f"the release holds {len(left)} tensors the conversion cannot place ({', '.join(left[:5])}"
            f"{', ...' if len(left) > 5 else ''}): a model without them would translate wrongly"
        )
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    for name in ("source.spm", "target.spm"):
        shutil.copyfile(release / name, out / name)
    positions = hf_config["max_position_embeddings"]
    tokenizer = {"tokenizer_class": "MarianTokenizer", "model_max_length": positions, "separate_vocabs": False}
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer, indent=2) + "\n")


def _hf_config(config: dict[str, Any], vocab: dict[str, int]) -> dict[str, Any]:
    """MarianMT's config.json for the release's architecture and vocabulary."""
    pad = vocab["<pad>"]
    width = int(config["dim-emb"])
    # Hugging Face's converter sets dim-emb (512 or 1024 in the released models); 512 at least for narrower ones.
    positions = max(512, width)
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        "vocab_size": pad + 1,
        "decoder_vocab_size": pad + 1,
        "d_model": width,
        "encoder_layers": int(config["enc-depth"]),
        "decoder_layers": int(config["dec-depth"]),
        "encoder_attention_heads": int(config["transformer-heads"]),
        "decoder_attention_heads": int(config["transformer-heads"]),
        "encoder_ffn_dim": int(config["transformer-dim-ffn"]),
        "decoder_ffn_dim": int(config.get("transformer-decoder-dim-ffn") or config["transformer-dim-ffn"]),
        "activation_function": config.get("transformer-ffn-activation", "swish"),
        "scale_embedding": True,
        "max_position_embeddings": positions,
        "pad_token_id": pad,
        "eos_token_id": vocab["</s>"],
        "decoder_start_token_id": pad,
        "forced_eos_token_id": vocab["</s>"],
        "bos_token_id": None,
        "share_encoder_decoder_embeddings": True,
        "tie_word_embeddings": True,
        "static_position_embeddings": True,
        "normalize_embedding": False,
        "add_bias_logits": False,
        "dropout": 0.1,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "is_encoder_decoder": True,
        "torch_dtype": "float32",
    }


def _hf_state(weights: Any, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Every parameter under Hugging Face's name: matrices transposed, vectors squeezed, one zero row
    (and bias entry) for <pad> after the vocabulary."""

    def vector(name: str) -> torch.Tensor:
        return torch.from_numpy(np.asarray(weights[name], dtype=np.float32)).reshape(-1)

    def matrix(name: str) -> torch.Tensor:
        return torch.from_numpy(np.asarray(weights[name], dtype=np.float32)).T.contiguous()

    embed = torch.from_numpy(np.asarray(weights["Wemb"], dtype=np.float32))  # (V, C)
    embed = torch.cat([embed, embed.new_zeros(1, embed.shape[1])])
    bias = vector("decoder_ff_logit_out_b") if "decoder_ff_logit_out_b" in weights else torch.zeros(embed.shape[0] - 1)
    state = {"model.shared.weight": embed, "final_logits_bias": torch.cat([bias, bias.new_zeros(1)]).view(1, -1)}
    for side, depth, blocks in (
        ("encoder", int(config["enc-depth"]), _ENCODER_BLOCKS),
        ("decoder", int(config["dec-depth"]), _DECODER_BLOCKS),
    ):
        for i in range(depth):
            marian, hf = f"{side}_l{i + 1}_", f"model.{side}.layers.{i}."
            for block, module, norm in blocks:
                for part, name in _ATTENTION.items():
                    key = f"{marian}{block}_{part}"
                    state[hf + f"{module}.{name}"] = matrix(key) if part.startswith("W") else vector(key)
                state[hf + f"{norm}.weight"] = vector(f"{marian}{block}_Wo_ln_scale")
                state[hf + f"{norm}.bias"] = vector(f"{marian}{block}_Wo_ln_bias")
            for part, name in _FFN.items():
                key = f"{marian}ffn_{part}"
                state[hf + name] = matrix(key) if part.startswith("W") else vector(key)
            state[hf + "final_layer_norm.weight"] = vector(f"{marian}ffn_ffn_ln_scale")
            state[hf + "final_layer_norm.bias"] = vector(f"{marian}ffn_ffn_ln_bias")
    return state
