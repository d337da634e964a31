"""ModelCalls: what the gateway calls on a model deployment's replica (translate, align, score), each call
forwarded to the replica's ServedModel for it and any failure answered as an ApiError, not raised
across Ray. PairModel (service/engine/replica.py) holds one model; ModelPool (service/engine/pool.py)
finds the multiplexed model the call names."""

from typing import TYPE_CHECKING

from model.decode.confidence import ScoringResult
from model.options import DecodeOptions
from service.engine.answers import Decoded
from service.errors import ApiError, returned

if TYPE_CHECKING:
    from service.engine.served_model import ServedModel


class ModelCalls:
    async def _served(self) -> "ServedModel":
        """The model this call is for (a pool loads it first)."""
        raise NotImplementedError

    async def translate(
        self,
        pair: str,
        texts: list[str],
        options: DecodeOptions,
        timeout_s: float,
        pieces: bool = False,
        trace: dict[str, str] | None = None,
    ) -> Decoded | ApiError:
        async def call() -> Decoded:
            return await (await self._served()).translate(pair, texts, options, timeout_s, pieces, trace)

        return await returned(call())

    async def score(
        self, pair: str, texts: list[tuple[str, str]], trace: dict[str, str] | None = None
    ) -> list[ScoringResult] | ApiError:
        async def call() -> list[ScoringResult]:
            return await (await self._served()).score(pair, texts, trace)

        return await returned(call())

    async def align(
        self, pair: str, texts: list[tuple[str, str]], trace: dict[str, str] | None = None
    ) -> list[list[list[int]]] | ApiError:
        async def call() -> list[list[list[int]]]:
            return await (await self._served()).align(pair, texts, trace)

        return await returned(call())
