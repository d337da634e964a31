"""Checkpoints: beamserve's own format, and import/export of Hugging Face MarianMT directories.

Own format (a directory): beamserve.json (ModelConfig), model.safetensors (our parameter names),
source.spm, target.spm, vocab.json, and target_vocab.json for a model with separate source and
target vocabularies. The tokenizer files are Marian's, so export only renames tensors and writes
Marian's config.

An int8 checkpoint (`save_int8`, `beamserve quantize`; "quantization": "int8" in the safetensors
metadata) holds each weight that computes in int8 as int8 rows and its row scales ("NAME.scale"),
the output projection as "output_projection" where it is tied to the embedding table (which stays
float); a replica loads it without quantising, to the same bits as quantising at load. Read as
float, its int8 weights are dequantised.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from model.io import fairseq_vocab
from model.io.tokenizer import Tokenizer
from model.kernels.compute_type import OUTPUT_PROJECTION, int8_sites
from model.kernels.quant import Int8Weight, int8_weight, quantize_weight
from model.nn.config import ModelConfig
from model.nn.transformer import Seq2Seq
from model.shipped import OWN_CONFIG, is_own_checkpoint

TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json")
TARGET_VOCAB = "target_vocab.json"  # separate vocabularies only


def tokenizer_files(directory: Path) -> list[str]:
    if fairseq_vocab.is_fairseq(directory):
        return [name for name in fairseq_vocab.FILES if (directory / name).exists()]
    return [*TOKENIZER_FILES, *([TARGET_VOCAB] if (directory / TARGET_VOCAB).exists() else [])]


# (our name pattern, Hugging Face Marian name template); applied to layer parameters.
_LAYER_NAMES = [
    (r"encoder_layers\.(\d+)\.self_attn\.", r"model.encoder.layers.\1.self_attn."),
    (r"encoder_layers\.(\d+)\.norm1\.", r"model.encoder.layers.\1.self_attn_layer_norm."),
    (r"encoder_layers\.(\d+)\.ffn\.(fc\d)\.", r"model.encoder.layers.\1.\2."),
    (r"encoder_layers\.(\d+)\.norm2\.", r"model.encoder.layers.\1.final_layer_norm."),
    (r"decoder_layers\.(\d+)\.self_attn\.", r"model.decoder.layers.\1.self_attn."),
    (r"decoder_layers\.(\d+)\.norm1\.", r"model.decoder.layers.\1.self_attn_layer_norm."),
    (r"decoder_layers\.(\d+)\.cross_attn\.", r"model.decoder.layers.\1.encoder_attn."),
    (r"decoder_layers\.(\d+)\.norm2\.", r"model.decoder.layers.\1.encoder_attn_layer_norm."),
    (r"decoder_layers\.(\d+)\.ffn\.(fc\d)\.", r"model.decoder.layers.\1.\2."),
    (r"decoder_layers\.(\d+)\.norm3\.", r"model.decoder.layers.\1.final_layer_norm."),
    (r"encoder_norm\.", r"model.encoder.layer_norm."),  # pre-norm stacks' last LayerNorm (M2M100, NLLB)
    (r"decoder_norm\.", r"model.decoder.layer_norm."),
]
# Hugging Face model types read here: Marian's, and M2M100's (NLLB-200 is one).
HF_TYPES = ("marian", "m2m_100")


def tokenizer(directory: Path) -> Tokenizer:
    """The directory's tokenizer: fairseq's vocabulary layout (M2M100, NLLB) or Marian's files."""
    return fairseq_vocab.load(directory) if fairseq_vocab.is_fairseq(directory) else Tokenizer.load(directory)


def hf_model_type(path: Path) -> str | None:
    """The model_type of a Hugging Face directory this module reads ("marian", "m2m_100"), else None."""
    config = path / "config.json"
    kind = json.loads(config.read_text()).get("model_type") if config.is_file() else None
    return kind if kind in HF_TYPES else None


def save(model: Seq2Seq, out: Path, tokenizer_dir: Path | None, dtype: torch.dtype = torch.float32) -> None:
    """Write the own format; tokenizer files are copied from tokenizer_dir when given."""
    if any(
        site.weight.numel() == 0 and site.form is not None for site in int8_sites(model, model.output_weight).values()
    ):
        raise ValueError(
            "this model computes in int8 and holds no float weights (Translator.load frees them): use save_int8"
        )
    out.mkdir(parents=True, exist_ok=True)
    model.cfg.save(out / OWN_CONFIG)
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer_dir is not None and tokenizer_dir.resolve() != out.resolve():
        for name in tokenizer_files(tokenizer_dir):
            shutil.copyfile(tokenizer_dir / name, out / name)


QUANTIZATION = "quantization"  # the safetensors metadata key of an int8 checkpoint
SCALE = ".scale"


def save_int8(model: Seq2Seq, out: Path, tokenizer_dir: Path | None) -> None:
    """Write the own format with the int8 weights (those `model` computes with where it was loaded with
    compute_type int8, else quantised now) in place of the float ones."""
    out.mkdir(parents=True, exist_ok=True)
    model.cfg.save(out / OWN_CONFIG)
    int8 = int8_sites(model, model.output_weight)
    tensors = {k: _compact(v) for k, v in model.state_dict().items() if k not in int8}
    for name, site in int8.items():
        q = site.form or quantize_weight(site.weight)
        tensors[name], tensors[name + SCALE] = q.qweight.contiguous(), q.scale.contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt", QUANTIZATION: "int8"})
    if tokenizer_dir is not None and tokenizer_dir.resolve() != out.resolve():
        for name in tokenizer_files(tokenizer_dir):
            shutil.copyfile(tokenizer_dir / name, out / name)


def _compact(t: torch.Tensor) -> torch.Tensor:
    """t on CPU in float16 where that holds every value exactly (a float16 checkpoint's), else float32."""
    t = t.detach().to("cpu", torch.float32).contiguous()
    half = t.half()
    return half if torch.equal(half.float(), t) else t


def quantization(path: Path) -> str | None:
    """ "int8" for an int8 checkpoint directory, else None."""
    if not is_own_checkpoint(path):
        return None
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return (f.metadata() or {}).get(QUANTIZATION)


def saved_int8(path: Path) -> dict[str, Int8Weight]:
    """An int8 checkpoint's int8 weights by name (compute_type.int8_sites' names); {} for others."""
    if quantization(path) != "int8":
        return {}
    tensors = load_file(str(path / "model.safetensors"))
    names = [k[: -len(SCALE)] for k in tensors if k.endswith(SCALE)]
    return {name: int8_weight(tensors[name], tensors[name + SCALE]) for name in names}


def _read_own(path: Path) -> dict[str, torch.Tensor]:
    """An own checkpoint's state dict in float32, int8 weights dequantised."""
    tensors = load_file(str(path / "model.safetensors"))
    scales = {k[: -len(SCALE)]: v for k, v in tensors.items() if k.endswith(SCALE)}
    state = {k: v.float() for k, v in tensors.items() if not k.endswith(SCALE) and k not in scales}
    for name, scale in scales.items():
        if name != OUTPUT_PROJECTION:  # a tied projection is the embedding table, stored in float
            state[name] = Int8Weight(tensors[name], scale).dequantize()
    return state


def load(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Read a checkpoint directory in either format -> (config, our state dict in float32)."""
    if is_own_checkpoint(path):
        return ModelConfig.load(path / OWN_CONFIG), _read_own(path)
    if hf_model_type(path) is not None:
        return _import_hf(path)
    missing = [n for n in ("beamserve.json", "config.json") if not (path / n).exists()]
    raise FileNotFoundError(
        f"{path} is neither a beamserve checkpoint nor a Hugging Face Marian or M2M100 directory (missing {missing})"
    )


def build(path: Path) -> Seq2Seq:
    """Load a checkpoint directory into a Seq2Seq in eval mode."""
    cfg, state = load(path)
    return Seq2Seq.from_state(cfg, state).eval()


def _config_from_hf(
    hf: dict[str, Any], generation: dict[str, Any], unk_token_id: int, final_logits_bias: bool
) -> ModelConfig:
    """Marian's config, or M2M100's: pre-norm, fairseq's positions, no logits bias, fairseq's ids, and </s>
    forced at the length limit only where its generation config (else its config) says so."""
    fairseq = hf.get("model_type") == "m2m_100"
    forced_eos = generation.get("forced_eos_token_id", hf.get("forced_eos_token_id"))
    vocab_size = hf["vocab_size"]
    shared = hf.get("share_encoder_decoder_embeddings", True)
    default_activation = "relu" if fairseq else "swish"
    activation = hf.get("activation_function", default_activation)
    return ModelConfig(
        vocab_size=vocab_size,
        decoder_vocab_size=vocab_size if shared else hf.get("decoder_vocab_size") or vocab_size,
        share_embeddings=shared,
        d_model=hf["d_model"],
        encoder_layers=hf["encoder_layers"],
        decoder_layers=hf["decoder_layers"],
        encoder_attention_heads=hf["encoder_attention_heads"],
        decoder_attention_heads=hf["decoder_attention_heads"],
        encoder_ffn_dim=hf["encoder_ffn_dim"],
        decoder_ffn_dim=hf["decoder_ffn_dim"],
        activation={"silu": "swish"}.get(activation, activation),
        normalize_before=fairseq,
        scale_embedding=hf.get("scale_embedding", True),
        tie_embeddings=hf.get("tie_word_embeddings", True),
        final_logits_bias=final_logits_bias,
        max_position_embeddings=hf.get("max_position_embeddings", 1024 if fairseq else 512),
        positions="fairseq" if fairseq else "marian",
        pad_token_id=hf["pad_token_id"],
        eos_token_id=hf["eos_token_id"],
        unk_token_id=unk_token_id,
        decoder_start_token_id=hf.get("decoder_start_token_id", hf["eos_token_id" if fairseq else "pad_token_id"]),
        forced_eos_token_id=forced_eos if fairseq else hf.get("forced_eos_token_id", hf["eos_token_id"]),
        dropout=hf.get("dropout", 0.1),
        attention_dropout=hf.get("attention_dropout", 0.0),
        activation_dropout=hf.get("activation_dropout", 0.0),
    )


# The weight files transformers' save_pretrained writes, in the order it prefers them: one file, or shards
# that an index names (`max_shard_size`: model-00001-of-00006.safetensors and the like).
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def _read_hf_weights(path: Path) -> dict[str, torch.Tensor]:
    """A Hugging Face directory's tensors, from one file or from every shard its index names."""
    name = next((n for n in HF_WEIGHTS if (path / n).is_file()), None)
    if name is None:
        raise FileNotFoundError(f"{path} has none of {', '.join(HF_WEIGHTS)}")

    def read(file: str) -> dict[str, torch.Tensor]:
        if file.endswith(".safetensors"):
            return load_file(str(path / file))
        return torch.load(path / file, map_location="cpu", weights_only=True)

    if not name.endswith(".index.json"):
        return read(name)
    weight_map: dict[str, str] = json.loads((path / name).read_text())["weight_map"]
    shards = sorted(set(weight_map.values()))
    missing = [f for f in shards if Path(f).name != f or not (path / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{path / name} names shards that are not in the directory: {', '.join(missing)}")
    tensors: dict[str, torch.Tensor] = {}
    for shard in shards:
        tensors.update(read(shard))
    absent = sorted(set(weight_map) - set(tensors))
    if absent:
        raise KeyError(f"{path / name}: {len(absent)} tensors not in their shards, {', '.join(absent[:3])}")
    return tensors


def _import_hf(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    hf_config = json.loads((path / "config.json").read_text())
    if fairseq_vocab.is_fairseq(path):  # fixed ids: the vocabulary is read once, by the tokenizer
        unk = fairseq_vocab.SPECIAL_IDS["<unk>"]
    else:
        unk = json.loads((path / "vocab.json").read_text(encoding="utf-8")).get("<unk>", 1)
    hf = _read_hf_weights(path)
    marian = hf_config.get("model_type") == "marian"
    generation_file = path / "generation_config.json"
    generation = json.loads(generation_file.read_text()) if generation_file.is_file() else {}
    cfg = _config_from_hf(hf_config, generation, unk, marian or "final_logits_bias" in hf)
    names = ("model.shared.weight", "model.encoder.embed_tokens.weight")
    source = next((hf[k] for k in (names if cfg.share_embeddings else names[::-1]) if k in hf), None)
    if source is None:
        raise KeyError(f"{path}: no source embedding ({' or '.join(names)}) in the weights")
    state = {"embed.weight": source.float()}
    if cfg.final_logits_bias:
        bias = hf.get("final_logits_bias", torch.zeros(1, cfg.decoder_vocab_size))
        state["final_logits_bias"] = bias.float().view(-1)
    if not cfg.share_embeddings:
        # The target side's own embedding; the output projection is tied to it unless lm_head is its own.
        target = hf.get("model.decoder.embed_tokens.weight", hf.get("lm_head.weight"))
        if target is None:
            raise KeyError(f"{path}: separate vocabularies but no model.decoder.embed_tokens.weight")
        state["target_embed.weight"] = target.float()
    if not cfg.tie_embeddings:
        state["lm_head.weight"] = hf["lm_head.weight"].float()
    with torch.device("meta"):  # the names alone: no weights allocated or initialised
        expected = list(Seq2Seq(cfg).state_dict())
    for ours in expected:
        if ours not in state:
            state[ours] = hf[to_hf_name(ours)].float()
    return cfg, state


def to_hf_name(name: str) -> str:
    for pattern, template in _LAYER_NAMES:
        if re.match(pattern, name):
            return re.sub(pattern, template, name)
    raise KeyError(f"no Marian name for parameter {name!r}")


def export_hf(src: Path, out: Path) -> None:
    """Write a Hugging Face MarianMT directory (loadable by transformers and CTranslate2's converter)."""
    cfg, state = load(src)
    if cfg.normalize_before:
        raise ValueError("Marian (Hugging Face) has no pre-norm variant; this model uses normalize_before=True")
    out.mkdir(parents=True, exist_ok=True)
    if cfg.share_embeddings:
        hf: dict[str, torch.Tensor] = {"model.shared.weight": state["embed.weight"]}
    else:
        hf = {
            "model.encoder.embed_tokens.weight": state["embed.weight"],
            "model.decoder.embed_tokens.weight": state["target_embed.weight"],
        }
        if cfg.tie_embeddings:  # transformers ties lm_head to the decoder's embedding; written out for other readers
            hf["lm_head.weight"] = state["target_embed.weight"].clone()
    if cfg.final_logits_bias:
        hf["final_logits_bias"] = state["final_logits_bias"].view(1, -1)
    if not cfg.tie_embeddings:
        hf["lm_head.weight"] = state["lm_head.weight"]
    for name, tensor in state.items():
        if name.startswith(("encoder_layers.", "decoder_layers.")):
            hf[to_hf_name(name)] = tensor
    save_file({k: v.contiguous() for k, v in hf.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(_hf_config(cfg), indent=2) + "\n")
    generation = {
        "bad_words_ids": [[cfg.pad_token_id]],
        "decoder_start_token_id": cfg.decoder_start_token_id,
        "eos_token_id": cfg.eos_token_id,
        "forced_eos_token_id": cfg.forced_eos_token_id,
        "pad_token_id": cfg.pad_token_id,
        "max_length": cfg.max_position_embeddings,
        "num_beams": 4,
    }
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "MarianTokenizer",
                "model_max_length": cfg.max_position_embeddings,
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<pad>",
                "separate_vocabs": not cfg.share_embeddings,
            },
            indent=2,
        )
        + "\n"
    )
    for name in tokenizer_files(src):
        if src.resolve() != out.resolve():
            shutil.copyfile(src / name, out / name)


def _hf_config(cfg: ModelConfig) -> dict[str, Any]:
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        "vocab_size": cfg.vocab_size,
        "decoder_vocab_size": cfg.decoder_vocab_size,
        "d_model": cfg.d_model,
        "encoder_layers": cfg.encoder_layers,
        "decoder_layers": cfg.decoder_layers,
        "encoder_attention_heads": cfg.encoder_attention_heads,
        "decoder_attention_heads": cfg.decoder_attention_heads,
        "encoder_ffn_dim": cfg.encoder_ffn_dim,
        "decoder_ffn_dim": cfg.decoder_ffn_dim,
        "activation_function": cfg.activation,
        "scale_embedding": cfg.scale_embedding,
        "max_position_embeddings": cfg.max_position_embeddings,
        "pad_token_id": cfg.pad_token_id,
        "eos_token_id": cfg.eos_token_id,
        "decoder_start_token_id": cfg.decoder_start_token_id,
        "forced_eos_token_id": cfg.forced_eos_token_id,
        "bos_token_id": None,
        "share_encoder_decoder_embeddings": cfg.share_embeddings,
        "tie_word_embeddings": cfg.tie_embeddings,
        "dropout": cfg.dropout,
        "attention_dropout": cfg.attention_dropout,
        "activation_dropout": cfg.activation_dropout,
        "is_encoder_decoder": True,
        "torch_dtype": "float32",
    }
