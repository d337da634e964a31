"""ModelPool: one deployment whose replicas load the registry's pooled models on demand and keep the
most recently used (Ray Serve's model multiplexing), for the many pairs that see little traffic;
busy pairs keep dedicated deployments (service/engine/replica.py).

The gateway calls a pooled pair with the model's name as the multiplexed model id; Serve routes the
call to a replica that holds that model when one does, and to another (which loads it) when none
does. A load runs in a thread, so the models a replica holds keep decoding meanwhile; calls for a
model being loaded wait for it (Serve's per-replica load lock), bounded by the request's deadline.
Past `pool_models_per_replica`, the least recently used model is evicted: it stops once the calls
using it have finished.
"""

import asyncio
import threading
from typing import TYPE_CHECKING, Any

from ray import serve

from service import local_ray, tracing
from service.engine import allocator
from service.engine.model_calls import ModelCalls
from service.registry import ModelEntry, ModelUnavailableError
from service.settings import Settings

if TYPE_CHECKING:
    from service.engine.served_model import ServedModel

POOL = "model-pool"  # the deployment's name


@serve.deployment(max_ongoing_requests=512, max_queued_requests=256, health_check_period_s=10)
class ModelPool(ModelCalls):
    """Pooled models, loaded on demand, the least recently used evicted past the bound."""

    def __init__(self, entries: list[dict[str, Any]], settings: dict[str, Any]) -> None:
        # Imported here: the process that builds the app (`beamserve serve`'s) has no use for torch.
        from service.engine.served_model import ServedModel

        local_ray.pin_replica_grpc()
        self.settings = Settings(**settings)
        tracing.setup(self.settings, "model")
        self.entries = {e.name: e for e in (ModelEntry.model_validate(x) for x in entries)}
        self.loads = 0  # models loaded by this replica since it started
        self.evictions = 0
        self.held: dict[str, ServedModel] = {}  # the models this replica holds now
        self.batching: dict[str, Any] = {}  # the pool's user_config, applied to each model as it loads

        async def load(name: str) -> "Evictable":
            entry = self.entries[name]
            # The pool's live batching knobs, then the entry's own settings over them.
            own = self.settings.model_copy(update=self.batching).for_entry(entry)
            model = await asyncio.to_thread(ServedModel, entry, own)
            self.loads += 1
            self.held[name] = model
            return Evictable(self, name, model)

        # Decorated here, not on the class: the bound comes from the settings.
        self._load = serve.multiplexed(max_num_models_per_replica=self.settings.pool_models_per_replica)(load)

    async def _served(self) -> "ServedModel":
        name = serve.get_multiplexed_model_id()
        if name not in self.entries:
            raise ModelUnavailableError(f"the model pool has no model {name!r}")
        try:
            evictable: Evictable = await self._load(name)
        except ModelUnavailableError:
            raise
        except Exception as exc:  # files that do not load: this pair fails, the pool goes on
            raise ModelUnavailableError(f"the {name} model did not load: {type(exc).__name__}: {exc}") from exc
        return evictable.model

    def check_health(self) -> None:
        problems = [f"{name}: {p}" for name, m in self.held.items() if (p := m.health()) is not None]
        if problems:
            raise RuntimeError("; ".join(problems))

    def reconfigure(self, config: dict[str, Any]) -> None:
        """Serve's user_config: batching knobs, applied live to every model held and to later loads."""
        self.batching = dict(config)
        for model in self.held.values():
            model.reconfigure({**config, **{k: v for k, v in model.entry.settings.items() if k in config}})

    async def info(self) -> dict[str, Any]:
        """With a model id, that model's info (loading it); without, the pool replica's: ready, and the
        models it holds."""
        if serve.get_multiplexed_model_id():
            return await (await self._served()).info()
        return self.pool_info()

    def pool_info(self) -> dict[str, Any]:
        from service.engine import engine_process  # as ServedModel's: the app's builder imports no torch

        return {
            "ready": True,
            "pool": {
                "replica": serve.get_replica_context().replica_tag,
                "held": sorted(self.held),
                "digests": {name: m.facts.digest for name, m in self.held.items()},
                "licenses": {name: m.facts.licence for name, m in self.held.items()},
                "models_per_replica": self.settings.pool_models_per_replica,
                "loads": self.loads,
                "evictions": self.evictions,
                # Engines running (threads of this process, or processes of their own): an evicted model's has stopped.
                "engines": sum(t.name == "beamserve-engine" for t in threading.enumerate()) + engine_process.running(),
                # This process's, and its engines' processes'.
                "resident_bytes": allocator.resident_bytes() + sum(m.engine_bytes() for m in self.held.values()),
            },
        }


class Evictable:
    """What the multiplexed loader hands Serve: a held model, closed when Serve evicts it. Serve awaits
    an evicted object's `__del__` when it is a coroutine function; set on the instance, so that the
    garbage collector (which looks on the class) never calls it."""

    def __init__(self, pool: ModelPool, name: str, model: "ServedModel") -> None:
        self.pool, self.name, self.model = pool, name, model
        self.__del__ = self.evict

    async def evict(self) -> None:
        self.pool.held.pop(self.name, None)
        self.pool.evictions += 1
        await self.model.close()
