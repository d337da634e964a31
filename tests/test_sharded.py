"""Every way a Hugging Face directory holds its weights loads to the same model: one safetensors file,
safetensors shards and `.bin` shards named by an index (how NLLB-200 1.3B and 3.3B are published), one
`.bin` file, and float16 weights (taken as their float32 values). Marian and NLLB (M2M100) layouts; the
single-file directories are held to transformers' `generate` by tests/test_hf_equivalence.py and
tests/test_nllb.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from model import Translator
from model.io import checkpoint

transformers = pytest.importorskip("transformers")

SHARD_BYTES = 30_000  # small enough that the tiny models need several shards


def with_files_of(src: Path, out: Path) -> Path:
    """`out` given every file of `src` that is not a weight file (configs, tokenizer)."""
    out.mkdir(exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.startswith(("model", "pytorch_model")) and not (out / f.name).exists():
            shutil.copyfile(f, out / f.name)
    return out


def bin_shards(state: dict[str, torch.Tensor], out: Path) -> None:
    """`.bin` shards and their index, as transformers before version 5 wrote them."""
    shards: list[list[str]] = [[]]
    size = 0
    for name in sorted(state):
        nbytes = state[name].numel() * state[name].element_size()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    weight_map = {}
    for i, group in enumerate(shards, start=1):
        file = f"pytorch_model-{i:05d}-of-{len(shards):05d}.bin"
        torch.save({n: state[n].contiguous() for n in group}, out / file)
        weight_map |= {n: file for n in group}
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())}}
    (out / "pytorch_model.bin.index.json").write_text(json.dumps(index | {"weight_map": weight_map}))


def layouts(src: Path, model_class: type, tmp: Path) -> dict[str, Path]:
    model = model_class.from_pretrained(src).eval()
    out: dict[str, Path] = {}
    for name in ("safetensors shards", "bin shards", "one bin", "float16", "float16 as float32"):
        (tmp / name).mkdir()
        out[name] = tmp / name
    model.save_pretrained(out["safetensors shards"], max_shard_size=SHARD_BYTES)
    state = {k: v for k, v in model.state_dict().items()}
    bin_shards(state, out["bin shards"])
    torch.save(state, out["one bin"] / "pytorch_model.bin")
    model.half().save_pretrained(out["float16"])
    model.float().save_pretrained(out["float16 as float32"])  # the same values, rounded, in float32
    for path in out.values():
        with_files_of(src, path)
    return out


def decoded(path: Path, texts: list[str], **languages: str) -> list[tuple[list[list[int]], list[float]]]:
    found = Translator.load(path, "cpu").translate(texts, beam_size=4, num_hypotheses=2, **languages)
    return [(r.token_ids, r.scores) for r in found]


def check(src: Path, model_class: type, tmp: Path, texts: list[str], **options: str) -> None:
    paths = layouts(src, model_class, tmp)
    assert len(list(paths["safetensors shards"].glob("model-*.safetensors"))) > 1
    assert len(list(paths["bin shards"].glob("pytorch_model-*.bin"))) > 1
    reference = decoded(src, texts, **options)
    for name in ("safetensors shards", "bin shards", "one bin"):
        assert decoded(paths[name], texts, **options) == reference, name
    assert decoded(paths["float16"], texts, **options) == decoded(paths["float16 as float32"], texts, **options)


def test_marian_loads_from_every_layout(tiny_dir: Path, tmp_path: Path, sources: list[str]) -> None:
    hf = tmp_path / "hf"
    checkpoint.export_hf(tiny_dir, hf)
    check(hf, transformers.MarianMTModel, tmp_path, sources[:8])


def test_nllb_loads_from_every_layout(nllb_dir: Path, tmp_path: Path) -> None:
    texts = ["A dog runs in the park.", "Two men are talking.", "The children play in the snow."]
    check(
        nllb_dir,
        transformers.M2M100ForConditionalGeneration,
        tmp_path,
        texts,
        src_lang="eng_Latn",
        tgt_lang="deu_Latn",
    )


def test_an_index_naming_a_missing_or_outside_shard_is_refused_by_name(tiny_dir: Path, tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    checkpoint.export_hf(tiny_dir, hf)
    model = transformers.MarianMTModel.from_pretrained(hf)
    sharded = with_files_of(hf, tmp_path / "sharded")
    model.save_pretrained(sharded, max_shard_size=SHARD_BYTES)
    first = sorted(sharded.glob("model-*.safetensors"))[0]
    first.unlink()
    with pytest.raises(FileNotFoundError, match=first.name):
        Translator.load(sharded, "cpu")
    index = sharded / "model.safetensors.index.json"
    found = json.loads(index.read_text())
    found["weight_map"] = {k: "../elsewhere.safetensors" for k in found["weight_map"]}
    index.write_text(json.dumps(found))
    with pytest.raises(FileNotFoundError, match="elsewhere"):
        Translator.load(sharded, "cpu")
