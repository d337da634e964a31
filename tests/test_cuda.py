"""The CUDA path: fp16/bf16 decoding with the KV cache on the GPU (skipped without a GPU)."""

import itertools
from pathlib import Path

import pytest
import torch

from model import DecodeOptions, Translator
from model.decode.decoding import CachedStepper, generate, pad_batch

from .conftest import read_lines


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_cached_equals_uncached_on_gpu(tiny_dir: Path, sources: list[str], dtype: str) -> None:
    tr = Translator.load(tiny_dir, "cuda", dtype=dtype)
    batch = [tr.encode(s) for s in sources]
    src, mask = pad_batch(batch, tr.model.cfg.pad_token_id, tr.device)
    opts = tr.search_options(DecodeOptions(beam_size=4))
    caps = torch.full((len(batch),), 30, device=tr.device)
    with torch.inference_mode():
        cached = generate(tr.model, src, mask, caps, opts)
        uncached = generate(tr.model, src, mask, caps, opts, cached=False)
    same = sum(c[0].tokens == u[0].tokens for c, u in zip(cached, uncached, strict=True))
    # float32 must agree exactly; half precision may flip a near-tie in a sentence or two.
    assert same == len(batch) if dtype == "float32" else same >= len(batch) - 2


@pytest.mark.cuda
def test_kv_cache_lives_on_the_gpu_in_half_precision(tiny_dir: Path, sources: list[str]) -> None:
    tr = Translator.load(tiny_dir, "cuda", dtype="float16")
    src, mask = pad_batch([tr.encode(s) for s in sources], tr.model.cfg.pad_token_id, tr.device)
    with torch.inference_mode():
        stepper = CachedStepper(tr.model, tr.model.encode(src, mask), mask, 4, 16)
    assert stepper.cache.k.device.type == "cuda" and stepper.cache.k.dtype == torch.float16
    assert all(k.device.type == "cuda" for k in stepper.cross.k)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_shipped_model_on_gpu_matches_cpu(dtype: str) -> None:
    texts = read_lines("test_2016_flickr.en.gz", 64)
    gpu = Translator.load("en-de", "cuda", dtype=dtype).translate(texts, beam_size=4)
    cpu = Translator.load("en-de", "cpu").translate(texts, beam_size=4)
    same = sum(g.hypotheses == c.hypotheses for g, c in zip(gpu, cpu, strict=True))
    assert same >= 58, f"only {same}/64 identical"
    assert "Hund" in Translator.load("en-de", "cuda", dtype=dtype).translate(["A dog runs."])[0].hypotheses[0]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_continuous_batching_on_gpu_equals_decoding_alone(dtype: str) -> None:
    from model.decode.inflight import InflightBatch

    tr = Translator.load("en-de", "cuda", dtype=dtype)
    texts = read_lines("test_2016_flickr.en.gz", 24)
    batch = InflightBatch(tr.model, rows=96, max_length=256)
    assert batch.cache.k.device.type == "cuda" and batch.cache.k.dtype == tr.dtype
    results: dict[object, list[int]] = {}
    jobs = [(i % 8, i, tr.encode(t), DecodeOptions(beam_size=1 + i % 4)) for i, t in enumerate(texts)]
    pending = list(jobs)  # (arrival step, key, source ids, options)
    step = 0
    while pending or batch.rows:
        for job in [p for p in pending if p[0] <= step]:
            pending.remove(job)
            _, key, ids, opts = job
            batch.add([key], [ids], tr.max_lengths([ids], opts).tolist(), tr.search_options(opts))
        results.update((k, h[0].tokens) for k, h in batch.step())
        step += 1
    same = sum(results[key] == tr.decode_batch([ids], opts)[0][0].tokens for _, key, ids, opts in jobs)
    # float32 must agree exactly; half precision may flip a near-tie in a sentence or two.
    assert same == len(texts) if dtype == "float32" else same >= len(texts) - 2


@pytest.mark.cuda
def test_loading_on_gpu_turns_off_cudnn_attention(tiny_dir: Path) -> None:
    # cuDNN attention plans each new shape anew and decoding makes new shapes every step: a burst of
    # requests took 15x longer with it on an H100 (docs/design.md, "GPU").
    torch.backends.cuda.enable_cudnn_sdp(True)
    Translator.load(tiny_dir, "cuda")
    assert not torch.backends.cuda.cudnn_sdp_enabled()


@pytest.mark.cuda
def test_no_repeat_ngrams_and_alignment_run_on_gpu() -> None:
    tr = Translator.load("en-de", "cuda", dtype="float16")
    ids = tr.translate(["dog " * 30], beam_size=4, no_repeat_ngram_size=2)[0].token_ids[0]
    bigrams = list(itertools.pairwise(ids))
    assert len(ids) > 4 and len(bigrams) == len(set(bigrams))
    src, tgt = "A man in a red shirt is riding a bike.", "Ein Mann in einem roten Hemd fährt Fahrrad."
    words = {tgt[slice(*k.target)]: src[slice(*k.source)] for k in tr.align([(src, tgt)])[0]}
    assert words["roten"] == "red" and words["Hemd"] == "shirt" and words["Fahrrad"] == "bike"
