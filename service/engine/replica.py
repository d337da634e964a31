"""PairModel: a dedicated deployment's replica, holding one model of the registry and its engine
(service/engine/served_model.py) for as long as it lives."""

from typing import Any

from ray import serve

from model.options import DecodeOptions
from service import local_ray, tracing
from service.engine.answers import Decoded
from service.errors import ApiError, returned
from service.registry import ModelEntry
from service.settings import Settings


# Requests past max_ongoing_requests wait in Serve's queue; past max_queued_requests the gateway is
# told at once (BackPressureError, answered 503), so nothing waits unbounded outside the engine's queue.
@serve.deployment(max_ongoing_requests=512, max_queued_requests=256, health_check_period_s=10)
class PairModel:
    """One model of the registry on one replica; it answers the entry's pairs."""

    def __init__(self, entry: dict[str, Any], settings: dict[str, Any]) -> None:
        # Imported here: the process that builds the app (`beamserve serve`'s) has no use for torch.
        from service.engine.served_model import ServedModel

        local_ray.pin_replica_grpc()
        own = Settings(**settings)
        tracing.setup(own, "model")
        self.model = ServedModel(ModelEntry.model_validate(entry), own)

    def check_health(self) -> None:
        """Serve's health check: a replica whose engine died or wedged is replaced, not only a dead one."""
        problem = self.model.health()
        if problem is not None:
            raise RuntimeError(problem)

    def reconfigure(self, config: dict[str, Any]) -> None:
        """Serve's user_config: batching knobs, applied live."""
        self.model.reconfigure(config)

    async def translate(
        self,
        pair: str,
        texts: list[str],
        options: DecodeOptions,
        timeout_s: float,
        pieces: bool = False,
        trace: dict[str, str] | None = None,
    ) -> Decoded | ApiError:
        return await returned(self.model.translate(pair, texts, options, timeout_s, pieces, trace))

    async def align(
        self, pair: str, texts: list[tuple[str, str]], trace: dict[str, str] | None = None
    ) -> list[list[list[int]]] | ApiError:
        return await returned(self.model.align(pair, texts, trace))

    async def info(self) -> dict[str, Any]:
        return await self.model.info()
