"""PairModel: a dedicated deployment's replica, holding one model of the registry and its engine
(service/engine/served_model.py) for as long as it lives."""

from typing import TYPE_CHECKING, Any

from ray import serve

from service import local_ray, tracing
from service.engine.model_calls import ModelCalls
from service.registry import ModelEntry
from service.settings import Settings

if TYPE_CHECKING:
    from service.engine.served_model import ServedModel


# Requests past max_ongoing_requests wait in Serve's queue; past max_queued_requests the gateway is
# told at once (BackPressureError, answered 503), so nothing waits unbounded outside the engine's queue.
@serve.deployment(max_ongoing_requests=512, max_queued_requests=256, health_check_period_s=10)
class PairModel(ModelCalls):
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

    async def _served(self) -> "ServedModel":
        return self.model

    async def info(self) -> dict[str, Any]:
        return await self.model.info()
