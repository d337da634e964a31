"""PairModel: one language pair's model and batching engine on one Serve replica (GPU-resident when
there is one). It raises the typed errors of service/errors.py; the gateway answers them."""

import asyncio
import math
import re
from functools import partial
from typing import Any

from ray import serve

from model.options import DecodeOptions
from model.translator import Translator, resolve_model_path
from service import allocator, local_ray
from service.engine import BatchingConfig, Engine, RequestTiming
from service.metrics import ModelMetrics
from service.scheduler import sized_for
from service.settings import Settings

WARMUP = "A man in a blue shirt is standing on a ladder."
# Alignment runs between decoder steps; 16 pairs take 57 ms on one CPU thread (about 3 steps of a full
# batch), 64 pairs 236 ms.
ALIGN_PAIRS_PER_TURN = 16
# A turn is one decoder step (milliseconds) or one request-mode batch (seconds at most on a CPU).
HEALTH_STALL_S = 60.0


def pair_of(model: str) -> str:
    """'en-de' from a model name or a directory such as .../opus-mt-en-de."""
    name = resolve_model_path(model).name
    match = re.search(r"([a-z]{2,3})-([a-z]{2,3})$", name)
    if not match:
        raise ValueError(f"cannot tell the language pair of model {model!r}: name its directory like 'en-de'")
    return f"{match.group(1)}-{match.group(2)}"


# Requests past max_ongoing_requests wait in Serve's queue; past max_queued_requests the gateway is
# told at once (BackPressureError, answered 503), so nothing waits unbounded outside the engine's queue.
@serve.deployment(max_ongoing_requests=512, max_queued_requests=256, health_check_period_s=10)
class PairModel:
    """One language pair's model and batching engine on one replica."""

    def __init__(self, model: str, settings: dict[str, Any]) -> None:
        local_ray.pin_replica_grpc()
        s = Settings(**settings)
        threads = s.threads or max(1, math.ceil(s.replica_cpus))
        self.pair = pair_of(model)
        self.translator = Translator.load(
            model, s.device, dtype=s.dtype, compute_type=s.compute_type, num_threads=threads
        )
        self.metrics = ModelMetrics(self.pair)
        self.metrics.load_time = self.translator.load_seconds
        tr = self.translator
        self.metrics.info_tags.update(digest=tr.digest, compute_type=tr.compute_type, device=tr.device.type)
        config = self._sized(s.model_dump())
        self.metrics.capacity = (config.max_queue, config.decode_slots)
        self.engine = Engine(self.translator, config, max_length=s.max_decoding_length)
        # Warm up on the engine's thread, the only one that runs the model (Translator.load says why).
        self.engine.warm_up([self.translator.encode(WARMUP)])
        self.engine.observer = self.metrics  # the warm-up is not traffic
        self.ready = True

    def check_health(self) -> None:
        """Serve's health check: a replica whose engine died or wedged is replaced, not only a dead one."""
        problem = self.engine.health(stall_s=HEALTH_STALL_S)
        if problem is not None:
            raise RuntimeError(problem)

    def reconfigure(self, config: dict[str, Any]) -> None:
        """Serve's user_config: batching knobs, applied live."""
        sized = self._sized(config)
        self.engine.reconfigure(sized)
        self.metrics.capacity = (sized.max_queue, sized.decode_slots)

    def _sized(self, config: dict[str, Any]) -> BatchingConfig:
        return sized_for(self.translator.device.type, config)

    async def translate(self, texts: list[str], options: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Each text's n-best (text, score) list and the token counts; raises SourceError (a text the model
        cannot take) and the engine's RequestTooLargeError, QueueFullError, DeadlineExceededError."""
        sources = [self.translator.encode(t) for t in texts]
        timing = RequestTiming()
        hyps = await self.engine.translate(sources, DecodeOptions(**options), timeout_s, timing)
        decode = self.translator.tokenizer.decode
        tokens = [(len(s), len(hs[0].tokens) + 1 if s else 0) for hs, s in zip(hyps, sources, strict=True)]
        return {
            "translations": [[(decode(h.tokens), h.score) for h in hs] for hs in hyps],
            "tokens": tokens,  # each text's (source, target) token counts
            "source_tokens": sum(s for s, _ in tokens),
            "target_tokens": sum(t for _, t in tokens),
            "queue_wait_s": timing.queue_wait_s,
            "decode_s": timing.decode_s,
        }

    async def align(self, pairs: list[tuple[str, str]]) -> list[list[list[int]]]:
        """Per (source, translation) pair, each target token's character span and that of the source token
        it attends to most, as [t_start, t_end, s_start, s_end] lists; computed on the engine's thread, a
        few pairs a turn so that decoder steps go on in between. Raises SourceError."""
        links: list[list[Any]] = []
        for start in range(0, len(pairs), ALIGN_PAIRS_PER_TURN):
            chunk = pairs[start : start + ALIGN_PAIRS_PER_TURN]
            links += await asyncio.wrap_future(self.engine.call(partial(self.translator.align, chunk)))
        return [[[*k.target, *k.source] for k in pair] for pair in links]

    def info(self) -> dict[str, Any]:
        tr = self.translator
        stats = self.engine.stats
        return {
            "name": self.pair,
            "source": self.pair.split("-")[0],
            "target": self.pair.split("-")[1],
            "device": str(tr.device),
            "dtype": str(tr.dtype).removeprefix("torch."),
            "compute_type": tr.compute_type,
            "digest": tr.digest,
            "max_source_tokens": tr.max_source_tokens,
            "ready": self.ready,
            "queued": self.engine.queued,
            "active": self.engine.active,
            "batches": stats.batches,
            "batched_sentences": stats.sentences,
            "max_batch_sentences": stats.max_sentences,
            "rejected": stats.rejected,
            "expired": stats.expired,
            "cancelled": stats.cancelled,
            "padded_tokens": stats.padded_tokens,
            "real_tokens": stats.real_tokens,
            "steps": stats.steps,
            "config": vars(self.engine.config),
            "allocator": allocator.in_use(),
            "resident_bytes": allocator.resident_bytes(),
        }
