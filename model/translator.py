"""Translator: text in, TranslationResult out."""

from __future__ import annotations

import hashlib
import logging
import math
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from pathlib import Path

import torch

from model import forced
from model.decode.align import Link
from model.decode.confidence import ScoringResult
from model.decode.decoding import generate, pad_batch
from model.decode.search import Hypothesis, SearchOptions
from model.decode.slots import StepKernels
from model.errors import InputTooLongError, InvalidTextError, SourceError, check_text
from model.io import checkpoint, generation, model_card
from model.io.codec import TextCodec
from model.io.tokenizer import LanguageError, Tokenizer
from model.kernels import compute_type as compute
from model.kernels import execution
from model.kernels.allocator import retain_freed_memory
from model.kernels.cpus import usable_cpus
from model.nn.config import ModelConfig
from model.nn.transformer import Seq2Seq
from model.options import DecodeOptions, max_length
from model.plan import execution_plan, step_kernels
from model.shipped import hub_revision, resolve_model_path
from model.workers import WorkerPool

logger = logging.getLogger(__name__)

__all__ = [
    "DecodeOptions",
    "InputTooLongError",
    "InvalidTextError",
    "LanguageError",
    "ScoringResult",
    "SourceError",
    "TranslationResult",
    "Translator",
    "check_text",
]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class TranslationResult:
    hypotheses: list[str]  # best first
    scores: list[float]  # per hypothesis, see DecodeOptions.length_penalty
    token_ids: list[list[int]] = field(repr=False)  # generated ids per hypothesis, </s> excluded
    source_tokens: int = 0  # source length in tokens, </s> included

    def __repr__(self) -> str:
        best, score = (self.hypotheses[0], self.scores[0]) if self.hypotheses else ("", 0.0)
        return f"TranslationResult({best!r}, score={score:.4f}, n={len(self.hypotheses)})"


class Translator:
    """A loaded model and tokenizer on one device; thread-compatible, not thread-safe."""

    def __init__(self, model: Seq2Seq, tokenizer: Tokenizer, *, device: torch.device, name: str = "") -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.name = name
        self.load_seconds = 0.0
        self.licence: str | None = None  # as the model card names it (model/io/model_card.py)
        self.revision: str | None = None  # the hub commit of a model loaded from the Hugging Face cache
        # What translate() decodes with where its caller gives no option: the model's generation_config.json over
        # beamserve's own (model/io/generation.py).
        self.generation = generation.Generation()
        self.defaults = DecodeOptions()
        self.pool: WorkerPool | None = None  # inter_threads > 1: batches decode in these processes
        # float32, int8, ... (model/kernels/compute_type.py); a model built here computes in its weights' dtype.
        self.compute_type = compute.named(self.dtype)

    @classmethod
    def load(
        cls,
        path: str | Path,
        device: str | torch.device | None = None,
        *,
        dtype: str | torch.dtype | None = None,
        compute_type: str | None = None,
        num_threads: int | None = None,
        inter_threads: int = 1,
    ) -> Translator:
        """Load an own-format or Hugging Face Marian directory, or a shipped model by name ("en-de").

        compute_type: CTranslate2's names (model/kernels/compute_type.py): "int8" quantises every linear layer
        and the output projection at load; "default" is float16 on CUDA, float32 on CPU. `dtype` is the
        float-only form of the same choice; give one or the other.

        num_threads: intra-op threads (CTranslate2's intra_threads), per worker when inter_threads > 1;
        default: the usable CPUs, shared out among the workers.
        inter_threads: batches decoded in parallel (CPU only), each by a worker process holding its own
        copy of the model (model/workers.py); `close()` stops them.
        """
        start = time.perf_counter()
        directory = resolve_model_path(path)
        dev = _device(device, inter_threads)
        ctype = _compute_type(directory, dev, dtype, compute_type)
        cpus = usable_cpus()
        pool = None
        if inter_threads > 1:  # started first: the workers load their copies while this process loads its own
            threads = num_threads or max(1, cpus // inter_threads)
            pool = WorkerPool(
                partial(cls.load, directory, "cpu", compute_type=ctype.name, num_threads=threads),
                workers=inter_threads,
            )
        try:
            model = _build(directory, dev, ctype)
            # The count for this thread and for threads that run torch later (each takes it on first use).
            torch.set_num_threads(num_threads or cpus)
            translator = cls(model, checkpoint.tokenizer(directory), device=dev, name=directory.name)
            translator.compute_type = ctype.name
        except BaseException:
            if pool is not None:
                pool.close()
            raise
        if pool is not None:
            translator.pool = pool
            weakref.finalize(translator, pool.close)
        found = generation.read(directory, model.cfg.pad_token_id)
        translator.generation, translator.defaults = found, found.defaults()
        if found.ignored:
            logger.warning(
                "%s: %s of its %s not applied (beamserve decodes by beam search, with no other penalty than the "
                "length's)",
                directory.name,
                ", ".join(found.ignored),
                generation.FILE,
            )
        translator.licence = model_card.licence(directory)
        translator.revision = hub_revision(directory)
        translator.load_seconds = time.perf_counter() - start
        return translator

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed.weight.dtype

    @property
    def plan(self) -> execution.Plan:
        """Which kernels compute this model (model/kernels/execution.py): its device, compute type, the C step or
        PyTorch's operators, and each GEMM shape's kernel, as load decided them."""
        return self.model.plan

    @property
    def step_kernels(self) -> StepKernels:
        """What the static decode step computes its attentions and log-probabilities with, as the plan names them
        (model/plan.py): the pool of model/decode/slot_decoder.py takes them."""
        return step_kernels(self.plan.step_kernels)

    @cached_property
    def digest(self) -> str:
        """sha256 of what decides the translations: every weight as computed with (name, dtype, shape,
        bytes; the int8 form of those that compute in int8), the compute type, and the tokenizer's models
        and vocabulary. Equal digests translate alike (a model quantised at load and its int8 checkpoint
        included); a cache can key on it."""
        return content_digest(self.model, self.tokenizer, self.compute_type, self.device.type == "cpu" and self.plan.c)

    @property
    def max_source_tokens(self) -> int:
        return self.model.cfg.max_position_embeddings

    @property
    def languages(self) -> list[str]:
        """The language codes of a multilingual model that names them by token (NLLB's eng_Latn, M2M100's
        en): each source needs its own (src_lang) and each translation its target's (tgt_lang); [] else."""
        return sorted(self.tokenizer.languages)

    @property
    def codec(self) -> TextCodec:
        """The text side alone (model/io/codec.py): what a process that holds no weights encodes with."""
        return TextCodec(self.tokenizer, self.max_source_tokens)

    def encode(self, text: str, *, truncate: bool = False, lang: str | None = None) -> list[int]:
        """Source text -> ids ending in </s>; [] for empty text; `lang`: the source language, where the model
        takes it (`languages`). Raises InputTooLongError, InvalidTextError, LanguageError."""
        return self.codec.encode(text, truncate=truncate, lang=lang)

    def align(
        self,
        pairs: Sequence[tuple[str, str]],
        *,
        batch_size: int = 64,
        src_lang: str | None = None,
        tgt_lang: str | None = None,
    ) -> list[list[Link]]:
        """Each target token of each (source, translation) pair linked to the source token it attends to most
        (model/forced.py); a pair with a blank side gets no links. Raises SourceError as `encode` does. A model
        with language tokens takes both languages, as `translate` does."""
        return forced.align(
            self.model, self.tokenizer, pairs, batch_size=batch_size, src_lang=src_lang, tgt_lang=tgt_lang
        )

    def score(
        self,
        sources: Sequence[str],
        targets: Sequence[str],
        *,
        batch_size: int = 32,
        src_lang: str | None = None,
        tgt_lang: str | None = None,
    ) -> list[ScoringResult]:
        """Each (source, target)'s tokens scored teacher-forced (model/forced.py), as CTranslate2's score_batch:
        the log-probability of every target token, </s> included (and, with language tokens, `tgt_lang`'s forced
        first), their total and length-normalised score; a blank source reads as </s> alone. Raises SourceError
        for a source or target the model cannot take (the index is the pair's), LanguageError as `translate`
        does."""
        return forced.score(
            self.model, self.codec, self.name, sources, targets, batch_size=batch_size, src_lang=src_lang,
            tgt_lang=tgt_lang,
        )  # fmt: skip

    def translate(
        self,
        texts: Sequence[str],
        options: DecodeOptions | None = None,
        progress: Callable[[int], None] | None = None,
        *,
        src_lang: str | None = None,
        tgt_lang: str | None = None,
        **kwargs: object,
    ) -> list[TranslationResult]:
        """Translate texts; options as a DecodeOptions or keyword arguments (beam_size=4, ...). A
        multilingual model that names languages by token (`languages`: NLLB, M2M100) needs the source
        and target language, `src_lang` and `tgt_lang` (Hugging Face's names); others take neither."""
        opts = replace(options or self.defaults, **kwargs)  # type: ignore[arg-type]
        opts.validate()
        if not self.tokenizer.languages and (src_lang or tgt_lang):
            raise LanguageError(
                f"{self.name or 'this model'} has no language tokens: give neither src_lang nor tgt_lang"
            )
        if tgt_lang is not None:
            opts = replace(opts, forced_bos_token_id=self.tokenizer.language_id(tgt_lang))
        elif self.tokenizer.languages and opts.forced_bos_token_id is None:
            raise LanguageError("this model translates into many languages: name the target language (tgt_lang)")
        sources = []
        for i, text in enumerate(texts):
            try:
                sources.append(self.encode(text, truncate=opts.truncate, lang=src_lang))
            except SourceError as exc:  # say which text
                raise type(exc)(exc.reason, i) from None
        hyps = self.translate_ids(sources, opts, progress)
        return [_result(self.tokenizer, h, len(src)) for h, src in zip(hyps, sources, strict=True)]

    def translate_ids(
        self,
        sources: Sequence[list[int]],
        opts: DecodeOptions,
        progress: Callable[[int], None] | None = None,
    ) -> list[list[Hypothesis]]:
        """Decode encoded sources in length-sorted batches; empty sources give one empty hypothesis.

        With worker processes (inter_threads > 1) the batches decode in parallel, cut smaller than
        max_batch_size where that gives each worker two or more; the results are those of decoding the
        same batches here.
        """
        out: list[list[Hypothesis]] = [[Hypothesis([], 0.0)] for _ in sources]
        order = sorted((i for i, s in enumerate(sources) if s), key=lambda i: len(sources[i]))
        size = opts.max_batch_size
        if self.pool is not None:
            # Two batches or more per worker, smaller ones if need be: with one (length-sorted) batch each,
            # the worker holding the longest sentences would finish alone, long after the others.
            size = min(size, max(1, math.ceil(len(order) / (2 * max(1, self.pool.workers)))))
        chunks = [order[start : start + size] for start in range(0, len(order), size)]

        def done(c: int, hyps: list[list[Hypothesis]]) -> None:
            for i, h in zip(chunks[c], hyps, strict=True):
                out[i] = h
            if progress is not None:
                progress(len(chunks[c]))

        if self.pool is not None and chunks:
            self.pool.run([[sources[i] for i in chunk] for chunk in chunks], opts, done)
        else:
            for c, chunk in enumerate(chunks):
                done(c, self.decode_batch([sources[i] for i in chunk], opts))
        return out

    def close(self) -> None:
        """Stop the worker processes, if any (the translator then decodes in this process)."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    @torch.inference_mode()
    def decode_batch(self, batch: list[list[int]], opts: DecodeOptions) -> list[list[Hypothesis]]:
        """One padded batch of non-empty encoded sources through encoder and search."""
        src_ids, src_mask = pad_batch(batch, self.model.cfg.pad_token_id, self.device)
        return generate(self.model, src_ids, src_mask, self.max_lengths(batch, opts), self.search_options(opts))

    def max_lengths(self, batch: list[list[int]], opts: DecodeOptions) -> torch.Tensor:
        """(B,) generated-token cap per sentence: the absolute cap, the ratio cap, the model's positions."""
        positions = self.model.cfg.max_position_embeddings
        caps = [max_length(opts, len(s), positions) for s in batch]
        return torch.tensor(caps, device=self.device)

    def search_options(self, opts: DecodeOptions) -> SearchOptions:
        return search_options(self.model.cfg, opts)


def _result(tokenizer: Tokenizer, hyps: list[Hypothesis], source_tokens: int) -> TranslationResult:
    return TranslationResult(
        [tokenizer.decode(h.tokens) for h in hyps], [h.score for h in hyps], [h.tokens for h in hyps], source_tokens
    )


def content_digest(model: Seq2Seq, tokenizer: Tokenizer, compute_type: str, c_kernels: bool) -> str:
    """Translator.digest: sha256 of every weight as computed with, the compute type, the tokenizer and, with
    `c_kernels`, the C decode-step kernels' own last bits."""
    h = hashlib.sha256()
    tensors = dict(model.state_dict())
    for name, site in compute.int8_sites(model, model.output_weight).items():
        q = site.form
        if q is not None:
            tensors.pop(name, None)  # its float form is not what the GEMMs read
            tensors[f"{name}:int8"], tensors[f"{name}:int8{checkpoint.SCALE}"] = q.qweight, q.scale
    for name, tensor in sorted(tensors.items()):
        t = tensor.detach().contiguous().cpu()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    h.update(tokenizer.fingerprint())
    h.update(f"compute_type:{compute_type}".encode())  # int8 GEMMs translate differently
    if c_kernels:
        h.update(b"kernels:c")
    return h.hexdigest()


def search_options(cfg: ModelConfig, opts: DecodeOptions) -> SearchOptions:
    """A request's decoding options as the search takes them, with what the model fixes (its end, start, padding
    and forced end tokens)."""
    return SearchOptions(
        beam_size=opts.beam_size,
        num_hypotheses=opts.num_hypotheses,
        length_penalty=opts.length_penalty,
        min_decoding_length=opts.min_decoding_length,
        early_stopping=opts.early_stopping,
        eos_token_id=cfg.eos_token_id,
        start_token_id=cfg.decoder_start_token_id,
        suppressed_token_ids=(cfg.pad_token_id,),
        forced_eos_token_id=cfg.forced_eos_token_id,
        forced_bos_token_id=opts.forced_bos_token_id,
        no_repeat_ngram_size=opts.no_repeat_ngram_size,
    )


def _device(device: str | torch.device | None, inter_threads: int) -> torch.device:
    """The device a load asked for (the default: default_device()), where it can run `inter_threads` workers."""
    if inter_threads < 1:
        raise ValueError(f"inter_threads must be >= 1, got {inter_threads}")
    dev = torch.device(device) if device is not None else default_device()
    if inter_threads > 1 and dev.type != "cpu":
        raise ValueError(f'inter_threads > 1 runs on CPU only (device="cpu"), not {dev.type}')
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(dev)!r} asked for, but this torch ({torch.__version__}) sees no CUDA GPU")
    return dev


def _compute_type(
    directory: Path, dev: torch.device, dtype: str | torch.dtype | None, compute_type: str | None
) -> compute.ComputeType:
    """What a load computes in: `compute_type` or `dtype` (not both), else an int8 checkpoint's int8 on CPU (as
    CTranslate2: a quantised model's default is the type it was saved in), else the device's default."""
    if dtype is not None and compute_type is not None:
        raise ValueError("give dtype or compute_type, not both")
    saved = checkpoint.quantization(directory)
    if saved == "int8" and dtype is None and compute_type in (None, "default") and dev.type == "cpu":
        compute_type = "int8"
    if compute_type is not None:
        return compute.resolve(compute_type, dev)
    torch_dtype = resolve_dtype(dtype, dev)
    return compute.ComputeType(compute.named(torch_dtype), torch_dtype, False)


def _build(directory: Path, dev: torch.device, ctype: compute.ComputeType) -> Seq2Seq:
    """The model on `dev` in `ctype`, its execution plan decided (model/plan.py), built on one intra-op thread.

    Ray sets OMP_NUM_THREADS=1 in workers; the caller chooses the intra-op thread count explicitly after this. Until
    then the model builds on one thread, so that loading starts no OpenMP team in this thread: a server decodes in
    another thread (service/engine/engine.py), and with two teams libgomp counts more threads than CPUs and stops
    spin-waiting between parallel regions. Every region then waits for a futex wake-up: requests took 2-2.5x as
    long on 2 cores (loadtests/bench_threads.py)."""
    torch.set_num_threads(1)
    if dev.type == "cpu":
        retain_freed_memory()  # no page faults for each step's logits (model/kernels/allocator.py)
    elif dev.type == "cuda":
        # cuDNN's attention builds an execution plan for each new shape, and decoding meets a new one nearly every
        # step (the cache grows; rows join and leave): the plans cost more than the steps. Flash /
        # memory-efficient attention need no plan.
        torch.backends.cuda.enable_cudnn_sdp(False)
    model = checkpoint.build(directory).to(dev, ctype.dtype)
    if ctype.int8:  # an int8 checkpoint's own weights, else quantised now; their float forms freed
        compute.quantize_int8(model, model.output_weight, checkpoint.saved_int8(directory))
        compute.release_float_weights(model, model.output_weight)
    # Which kernels compute, decided here once, on this one thread: what it compares (the library's LayerNorm and
    # SiLU against ATen's) gives the same answer at any thread count.
    model.use_plan(execution_plan(model, dev, ctype.name))
    return model


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.float16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]
