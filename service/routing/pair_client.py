"""A pair's model as the router calls it: translate, align, score and info, each typed and answered within its
time (2 s of grace past it, then 504). The replica's typed errors are raised as ApiErrors, and a call
whose replica died under it is made once more (Serve routes it to a live or restarted replica) while
RETRY_MIN_S of its time is left."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from model.decode.confidence import ScoringResult
from model.options import DecodeOptions
from service import tracing
from service.engine.answers import Decoded
from service.errors import ApiError, api_error
from service.routing.local_handle import PairHandle

RETRY_MIN_S = 1.0  # a call retried after its replica died needs at least this much of its time left
GRACE_S = 2.0  # past its time, a call is waited on this much longer for the replica's own 504
logger = logging.getLogger(__name__)
Links = list[list[list[int]]]  # per (sentence, translation): [target start, end, source start, end] spans


class PairClient:
    """Calls on one pair's model, whether a deployment (a Serve handle) or held in this process."""

    def __init__(self, pair: str, handle: PairHandle) -> None:
        self.pair, self.handle = pair, handle

    async def translate(
        self, sentences: list[str], opts: DecodeOptions, timeout: float, *, pieces: bool = False
    ) -> Decoded:
        """Each sentence's n-best and token counts; the replica is told the time left, its own deadline. With
        `pieces`, a sentence longer than the model takes is translated in pieces, not refused."""
        with tracing.client_span(f"call translate {self.pair}", **{"beamserve.sentences": len(sentences)}):
            trace = tracing.carrier()
            decoded: Decoded = await self._call(
                lambda left: self.handle.translate.remote(self.pair, sentences, opts, left, pieces, trace), timeout
            )
        return decoded

    async def align(self, pairs: list[tuple[str, str]], timeout: float) -> Links:
        """Each (sentence, translation)'s links between target and source spans."""
        with tracing.client_span(f"call align {self.pair}", **{"beamserve.pairs": len(pairs)}):
            trace = tracing.carrier()
            links: Links = await self._call(lambda _: self.handle.align.remote(self.pair, pairs, trace), timeout)
        return links

    async def score(self, pairs: list[tuple[str, str]], timeout: float) -> list[ScoringResult]:
        """Each (sentence, translation)'s tokens scored by the model (Translator.score)."""
        with tracing.client_span(f"call score {self.pair}", **{"beamserve.pairs": len(pairs)}):
            trace = tracing.carrier()
            found: list[ScoringResult] = await self._call(
                lambda _: self.handle.score.remote(self.pair, pairs, trace), timeout
            )
        return found

    async def info(self, timeout: float) -> dict[str, Any]:
        found: dict[str, Any] = await self._call(lambda _: self.handle.info.remote(), timeout)
        return found

    async def _call(self, start: Callable[[float], Any], timeout: float) -> Any:
        """start(time left)'s answer: a Serve response, or a LocalResponse, awaited and cancelled alike."""
        deadline = time.monotonic() + timeout
        for attempt in (1, 2):
            left = deadline - time.monotonic()
            response = start(left)
            try:
                async with asyncio.timeout(left + GRACE_S):  # in this task: wait_for would start one a call
                    result = await response
            except TimeoutError:
                response.cancel()
                raise ApiError("timeout", f"no answer within {timeout:.0f}s") from None
            except Exception as exc:
                known = api_error(exc)
                if known is None:
                    raise
                if known.code == "replica_unavailable" and attempt == 1 and deadline - time.monotonic() > RETRY_MIN_S:
                    logger.warning("the %s replica died mid-request; asking again (%s)", self.pair, exc)
                    continue
                raise known from None
            if isinstance(result, ApiError):  # a refusal the replica answered (errors.returned)
                raise result
            return result
        raise AssertionError("unreachable")
