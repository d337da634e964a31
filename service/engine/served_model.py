"""ServedModel: one registry entry's model and batching engine in a replica process (GPU-resident when
there is one): what a dedicated deployment's replica holds one of (service/engine/replica.py) and a pool
replica several (service/engine/pool.py). It raises the typed errors of service/errors.py; the gateway
answers them."""

import asyncio
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from functools import partial
from typing import Any

import torch

from model.decode.confidence import ScoringResult
from model.errors import InputTooLongError
from model.io import checkpoint, model_card
from model.io.codec import TextCodec
from model.options import DecodeOptions
from model.shipped import resolve_model_path
from model.translator import Translator, default_device
from service import tracing
from service.batching import BatchingConfig, sized_for
from service.engine import allocator
from service.engine.answers import Decoded
from service.engine.engine import Engine, RequestTiming, warm_up
from service.engine.engine_host import HostSpec, ModelFacts
from service.engine.engine_process import EngineProcess
from service.metrics import ModelMetrics
from service.registry import ModelEntry
from service.settings import Settings
from service.text.sentences import join_translations

logger = logging.getLogger(__name__)
WARMUP = "A man in a blue shirt is standing on a ladder."
# Alignment and scoring run between decoder steps; 16 pairs take 57 ms on one CPU thread (about 3 steps of a
# full batch), 64 pairs 236 ms.
PAIRS_PER_TURN = 16
# A turn is one decoder step (milliseconds) or one request-mode batch (seconds at most on a CPU).
HEALTH_STALL_S = 60.0


class ServedModel:
    """One model of the registry and its engine; it answers the entry's pairs (a multilingual model:
    each target through its target token). Built off the event loop (it loads and warms up)."""

    def __init__(self, entry: ModelEntry, s: Settings) -> None:
        self.entry = entry
        self.request_timeout_s = s.request_timeout_s
        threads = s.threads or max(1, math.ceil(s.replica_cpus))
        self.pair = entry.name  # the metrics' pair label: the model's name (its one pair, most often)
        device = torch.device(s.device) if s.device is not None else default_device()  # as Translator.load's
        config = sized_for(device.type, s.model_dump())
        static_slots, compiled = s.uses_static_slots(device.type), s.compiled_step
        source, target = entry.pairs[0].split("-")
        warm = (self._source(target, WARMUP), entry.language_tokens.get(source) if entry.language_tokens else None)
        self.engine: Engine | EngineProcess
        if s.uses_engine_process(entry):
            spec = HostSpec(
                entry.path, str(device), s.dtype, s.compute_type, threads, config, s.max_decoding_length,
                static_slots, compiled, warm, HEALTH_STALL_S,
            )  # fmt: skip
            self.engine = EngineProcess(spec)
            self.facts = self.engine.facts
            self.codec = TextCodec(checkpoint.tokenizer(resolve_model_path(entry.path)), self.facts.max_source_tokens)
        else:
            translator = Translator.load(
                entry.path, device, dtype=s.dtype, compute_type=s.compute_type, num_threads=threads
            )
            self.engine = Engine(
                translator, config, max_length=s.max_decoding_length, static_slots=static_slots, compiled_step=compiled
            )
            # Warm up on the engine's thread, the only one that runs the model (Translator.load says why).
            warm_up(self.engine, [translator.encode(warm[0], lang=warm[1])])
            self.facts = ModelFacts.of(translator)
            self.codec = translator.codec
        facts = self.facts
        entry.check_tokens(self.codec.tokenizer.vocab)
        entry.check_languages(self.codec.tokenizer.languages)
        if model_card.non_commercial(facts.licence):  # an operator serving it commercially must know
            logger.warning("%s: licence %s forbids commercial use", entry.name, facts.licence)
        if facts.device_type == "cpu" and not facts.kernels_built:  # every replica's log says so
            logger.warning("%s decodes without beamserve's C kernels: %s", entry.name, facts.kernels)
        self.metrics = ModelMetrics(self.pair)
        self.metrics.load_time = facts.load_seconds
        self.metrics.info_tags.update(digest=facts.digest, compute_type=facts.compute_type, device=facts.device_type)
        self.metrics.capacity = (config.max_queue, config.decode_slots)
        # What this replica computes with, in its log (each int8 weight shape's GEMM: model/kernels/int8_choice.py).
        logger.info(
            "%s: licence %s; %s, %s; C kernels %s; continuous batching on %s%s; the engine %s",
            entry.name,
            facts.licence or "not named by its model card",
            facts.device_type,
            facts.compute_type,
            facts.kernels,
            "the static decode state" if static_slots else "the in-flight batch",
            ", its step compiled" if compiled else "",
            f"in process {self.engine.process.pid}" if isinstance(self.engine, EngineProcess) else "in this process",
        )
        self.engine.observer = self.metrics  # the warm-up is not traffic
        self.metrics.serving()
        self.in_flight = 0  # calls using the model now: closing waits for them
        self.ready = True

    def health(self) -> str | None:
        return self.engine.health(stall_s=HEALTH_STALL_S)

    def reconfigure(self, config: dict[str, Any]) -> None:
        """Batching knobs, applied live."""
        sized = self._sized(config)
        self.engine.reconfigure(sized)
        self.metrics.capacity = (sized.max_queue, sized.decode_slots)

    async def close(self) -> None:
        """Stop the engine once the calls using the model have finished (bounded by the request
        timeout), and withdraw its metrics' model info."""
        deadline = time.monotonic() + self.request_timeout_s + 5.0
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.ready = False
        await asyncio.to_thread(self.engine.close)
        self.metrics.closed()

    @asynccontextmanager
    async def _using(self) -> AsyncIterator[None]:
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    def _sized(self, config: dict[str, Any]) -> BatchingConfig:
        return sized_for(self.facts.device_type, config)

    def _source(self, target: str, text: str) -> str:
        """The text as the model takes it toward `target`: behind the target's token, if it has one."""
        token = self.entry.target_tokens.get(target)
        return f"{token} {text}" if token else text

    def _languages(self, pair: str) -> tuple[str | None, str | None]:
        """A model with language tokens (NLLB, M2M100): its own codes of the pair's source and target."""
        source, target = pair.split("-")
        codes = self.entry.language_tokens
        return (codes[source], codes[target]) if codes else (None, None)

    def _encode(self, pair: str, text: str) -> list[int]:
        source_lang, _ = self._languages(pair)
        return self.codec.encode(self._source(pair.split("-")[1], text), lang=source_lang)

    def _fits(self, pair: str, text: str) -> bool:
        try:
            self._encode(pair, text)
            return True
        except InputTooLongError:
            return False

    def pieces(self, pair: str, text: str) -> list[str]:
        """A text longer than the model takes for `pair` as pieces that each fit (word_pieces)."""
        return word_pieces(text, partial(self._fits, pair), self.codec.max_source_tokens)

    async def translate(
        self,
        pair: str,
        texts: list[str],
        options: DecodeOptions,
        timeout_s: float,
        pieces: bool = False,
        trace: dict[str, str] | None = None,
    ) -> Decoded:
        """Each text's n-best for `pair` ("en-de"), its token counts and the time in the engine; raises
        SourceError (a text the model cannot take) and the engine's RequestTooLargeError,
        QueueFullError, DeadlineExceededError. With `pieces`, a text longer than the model takes is translated
        in pieces cut between words (`pieces`), their translations joined by spaces, instead of refused.
        `trace`: the caller's trace context (service/tracing.py), continued by this call's spans."""
        with tracing.continued(f"translate {pair}", trace, **{"beamserve.texts": len(texts)}):
            return await self._translate(pair, texts, options, timeout_s, pieces)

    async def _translate(
        self, pair: str, texts: list[str], options: DecodeOptions, timeout_s: float, pieces: bool
    ) -> Decoded:
        sources: list[list[int]] = []
        spans: list[tuple[int, int]] = []  # each text's first source and how many it has
        with tracing.span("tokenize"):
            for text in texts:
                try:
                    ids = [self._encode(pair, text)]
                except InputTooLongError:
                    if not pieces:
                        raise
                    ids = [self._encode(pair, piece.strip()) for piece in self.pieces(pair, text) if piece.strip()]
                spans.append((len(sources), len(ids)))
                sources += ids
        _, target_lang = self._languages(pair)
        if target_lang is not None:  # the target's token forced first
            options = replace(options, forced_bos_token_id=self.codec.tokenizer.language_id(target_lang))
        timing = RequestTiming(traced=tracing.recording())
        async with self._using():
            hyps = await self.engine.translate(sources, options, timeout_s, timing)
        timing.trace()
        with tracing.span("detokenize"):
            decode = self.codec.decode
            nbest = [[(decode(h.tokens), h.score) for h in hs] for hs in hyps]
        tokens = [(len(s), len(hs[0].tokens) + 1 if s else 0) for hs, s in zip(hyps, sources, strict=True)]
        if len(sources) > len(texts):  # a text in pieces: their n-best joined as a paragraph's sentences are
            nbest = [nbest[a] if n == 1 else join_translations(nbest[a : a + n], [" "] * (n - 1)) for a, n in spans]
            tokens = [tuple(map(sum, zip(*tokens[a : a + n], strict=True))) for a, n in spans]  # type: ignore[misc]
        return Decoded(nbest=nbest, tokens=tokens, queue_wait_s=timing.queue_wait_s, decode_s=timing.decode_s)

    async def align(
        self, pair: str, texts: list[tuple[str, str]], trace: dict[str, str] | None = None
    ) -> list[list[list[int]]]:
        """Per (source, translation) of `pair`, each target token's character span and that of the source
        token it attends to most, as [t_start, t_end, s_start, s_end] lists; computed on the engine's thread,
        a few pairs a turn so that decoder steps go on in between. Raises SourceError."""
        with tracing.continued(f"align {pair}", trace, **{"beamserve.pairs": len(texts)}):
            return await self._align(pair, texts)

    async def _align(self, pair: str, texts: list[tuple[str, str]]) -> list[list[list[int]]]:
        target = pair.split("-")[1]
        token = self.entry.target_tokens.get(target)
        shift = len(token) + 1 if token else 0  # source spans are the text's, without the target token
        tagged = [(self._source(target, s), t) for s, t in texts]
        source_lang, target_lang = self._languages(pair)
        links: list[list[Any]] = []
        async with self._using():
            for start in range(0, len(tagged), PAIRS_PER_TURN):
                chunk = tagged[start : start + PAIRS_PER_TURN]
                links += await self.engine.align(chunk, src_lang=source_lang, tgt_lang=target_lang)
        return [[[*k.target, max(0, k.source[0] - shift), max(0, k.source[1] - shift)] for k in one] for one in links]

    async def score(
        self, pair: str, texts: list[tuple[str, str]], trace: dict[str, str] | None = None
    ) -> list[ScoringResult]:
        """Per (source, translation) of `pair`, the translation's tokens scored teacher-forced (Translator.score),
        on the engine's thread a few pairs a turn, as alignment. Raises SourceError."""
        with tracing.continued(f"score {pair}", trace, **{"beamserve.pairs": len(texts)}):
            target = pair.split("-")[1]
            tagged = [(self._source(target, s), t) for s, t in texts]
            source_lang, target_lang = self._languages(pair)
            out: list[ScoringResult] = []
            async with self._using():
                for start in range(0, len(tagged), PAIRS_PER_TURN):
                    chunk = tagged[start : start + PAIRS_PER_TURN]
                    out += await self.engine.score(chunk, src_lang=source_lang, tgt_lang=target_lang)
            return out

    def engine_bytes(self) -> int:
        """The resident memory of the engine's own process (0 for an engine in this one)."""
        return self.engine.resident_bytes if isinstance(self.engine, EngineProcess) else 0

    async def info(self) -> dict[str, Any]:
        facts, engine = self.facts, self.engine
        if isinstance(engine, EngineProcess):
            await engine.refresh()
        stats = engine.stats
        process = engine.process.pid if isinstance(engine, EngineProcess) else None
        return {
            "model": self.entry.name,
            "device": facts.device,
            "dtype": facts.dtype,
            "compute_type": facts.compute_type,
            "digest": facts.digest,
            "max_source_tokens": facts.max_source_tokens,
            "defaults": facts.defaults,
            "license": facts.licence,
            "revision": facts.revision,
            "non_commercial": model_card.non_commercial(facts.licence),
            "ready": self.ready,
            "queued": engine.queued,
            "active": engine.active,
            "batches": stats.batches,
            "batched_sentences": stats.sentences,
            "max_batch_sentences": stats.max_sentences,
            "rejected": stats.rejected,
            "expired": stats.expired,
            "cancelled": stats.cancelled,
            "padded_tokens": stats.padded_tokens,
            "real_tokens": stats.real_tokens,
            "steps": stats.steps,
            "engine_cpu_s": stats.cpu_s,
            "config": vars(engine.config),
            "engine_process": process,
            "allocator": facts.allocator,
            "kernels": facts.kernels,
            "plan": facts.plan,
            # The model's process: the engine's own when it has one.
            "resident_bytes": self.engine_bytes() if process else allocator.resident_bytes(),
        }


def word_pieces(text: str, fits: Callable[[str], bool], max_tokens: int) -> list[str]:
    """`text` as consecutive pieces that each fit (joined, the text), cut between words: each the longest run of
    words from where the last ended that fits, found by halving (a few encodings a piece, not one per word);
    InputTooLongError for a word too long alone (no cut of it would be language)."""
    parts = re.split(r"(\s+)", text)
    out: list[str] = []
    start = 0
    while start < len(parts):
        if not fits(parts[start]):
            raise InputTooLongError(
                f"a word of {len(parts[start])} characters is longer than this model takes ({max_tokens} tokens)"
            )
        fit, past = start + 1, len(parts) + 1  # parts[start:fit] fits; parts[start:past] does not (or ends)
        while past - fit > 1:
            mid = (fit + past) // 2
            if fits("".join(parts[start:mid])):
                fit = mid
            else:
                past = mid
        out.append("".join(parts[start:fit]))
        start = fit
    return out
