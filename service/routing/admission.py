"""The gateway's first refusal: work it has sent to a pair, against the level at which the pair last
said it was full.

The engine decides admission exactly (service/engine/scheduler.py: the queued work over its decoding rate).
A refusal from it costs a round trip to the replica and a turn of the replica's event loop, which
on a loaded host competes with decoding. So the gateway remembers, per pair, how much work
(sentences x beams) it had in flight when the pair refused, and for HOLD_S after that refuses at
once any request that would take its work in flight to that level (the refused request's own work
included: a smaller one may still fit). Below it requests go on to the
engine, which refuses again (raising the level's freshness) or accepts. A level older than HOLD_S is
forgotten, so a pair that gained replicas is asked again within a second.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from service.error_codes import RETRY_AFTER_S
from service.errors import ApiError, retry_after

HOLD_S = 1.0  # how long a pair's refusal stands for the requests at or above its level


class PairAdmission:
    """One pair at one gateway replica: its work in flight and the level of its last refusal."""

    def __init__(self, pair: str) -> None:
        self.pair = pair
        self.in_flight = 0  # sentences x beams sent to the pair's replicas, not yet answered
        self.full_at: int | None = None  # in-flight work, the refused request's included, at the last refusal
        self.full_until = 0.0  # monotonic time the refusal stands until
        self.refused_here = 0  # requests this gateway refused on the pair's behalf

    def check(self, work: int) -> None:
        """ApiError 503 when this work would take the pair to the level it last refused at."""
        if self.full_at is None or time.monotonic() >= self.full_until:
            self.full_at = None
            return
        if self.in_flight + work >= self.full_at:
            self.refused_here += 1
            raise ApiError(
                "overloaded",
                f"{self.pair} has {self.in_flight} sentence-beams in flight; it refused work at {self.full_at}",
                retry_after(RETRY_AFTER_S["overloaded"]),
            )

    @contextlib.contextmanager
    def holding(self, work: int) -> Iterator[None]:
        """Count `work` in flight while the call runs; a refusal from the pair sets the level."""
        self.check(work)
        self.in_flight += work
        try:
            yield
        except ApiError as exc:
            if exc.code == "overloaded":
                self.full_at = self.in_flight  # this request's work on top of the rest was too much
                self.full_until = time.monotonic() + HOLD_S
            raise
        finally:
            self.in_flight -= work
