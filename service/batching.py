"""The batching engine's knobs (BatchingConfig), set in the server's settings and tunable live through the
Serve config's user_config, and the sizes a GPU replica takes where they are left unset."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Mode = Literal["continuous", "request", "none"]


@dataclass(frozen=True)
class BatchingConfig:
    mode: Mode = "continuous"  # continuous (iteration-level), request (whole batches), none (one at a time)
    max_batch_tokens: int = 6144  # source tokens x beams decoding together (request mode: padded)
    max_batch_size: int = 64  # sentences decoding together
    batch_wait_ms: float = 5.0  # request mode: how long a batch may wait to fill
    max_queue: int = 512  # sentences waiting; past it, 503 with Retry-After
    decode_slots: int = 256  # continuous mode: hypothesis rows (sum of beam sizes) in the preallocated cache
    max_waiting_steps: int = 6  # continuous mode: decoder steps after an admission before the next, so that
    # newcomers join together (the encoder then runs once for all of them), unless the engine is idle
    waiting_served_ratio: float = 0.25  # continuous mode: newcomers join at once when those that fit are at
    # least this fraction of the sentences running (TGI's knob of that name)
    alone_max_sentences: int = 4  # continuous mode: an idle engine decodes a queue of at most this many short
    # sentences of one set of options as one whole batch, without the running batch's per-step bookkeeping
    # (engine/scheduler.py ALONE_MAX_STEPS: each capped at 64 tokens); 0: always the running batch
    max_queue_wait_s: float = 1.0  # a request that would wait longer than this before it starts decoding
    # (the work queued ahead of it over the recent decoding rate) is refused at once with 503


# A GPU's decoder step costs about the same for 1,024 rows as for 256 (it is bound by per-step
# overhead, not arithmetic), so where the sizes are left unset a GPU replica takes bigger batches:
# on an H100, continuous batching sustained 896 requests/s at p95 <= 1 s with these against 320
# with the CPU's (docs/benchmarks.md, "Batching").
GPU_SIZES: dict[str, int] = {"decode_slots": 1024, "max_batch_size": 256, "max_batch_tokens": 32768, "max_queue": 4096}


def batching_knobs(values: Mapping[str, object]) -> dict[str, object]:
    """The BatchingConfig fields of a settings dict; unset sizes stay None (each replica sizes them)."""
    return {k: v for k, v in values.items() if k in BatchingConfig.__dataclass_fields__}


def sized_for(device_type: str, values: Mapping[str, object]) -> BatchingConfig:
    """A BatchingConfig from settings (other keys ignored); sizes left None take the device's."""
    given = {k: v for k, v in batching_knobs(values).items() if v is not None}
    return BatchingConfig(**{**(GPU_SIZES if device_type == "cuda" else {}), **given})  # type: ignore[arg-type]
