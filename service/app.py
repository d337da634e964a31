"""The Ray Serve application: one ingress (service/gateway.py), one model deployment per model of
the registry (service/registry.py, service/replica.py), each answering its language pairs.
`serve run service.app:build_app` and the Serve config import it.

One deployment per model (not model multiplexing): each model is always loaded (the models are
small), scales on its own load with its own autoscaling config, and a model's replicas never evict
each other's weights, which multiplexing's per-replica LRU would do under mixed traffic.
"""

from typing import Any

from ray import serve

from service.allocator import replica_env
from service.gateway import Gateway
from service.pool import POOL, ModelPool
from service.replica import PairModel
from service.scheduler import batching_knobs
from service.settings import Settings


def build_app(args: dict[str, Any] | None = None) -> serve.Application:
    """Application builder for `serve run service.app:build_app` and the Serve config's import_path.

    args (all optional) are Settings fields, e.g. {"models": "en-de,en-fr", "replica_cpus": 1}.
    """
    settings = Settings(**(args or {}))
    import torch

    pairs: dict[str, Any] = {}
    found = settings.entries()
    pooled = [e for e in found if e.pool]
    for entry in (e for e in found if not e.pool):
        own = settings.for_entry(entry)
        env = replica_env(own.allocator)
        gpus = own.replica_gpus if own.replica_gpus is not None else (1 if torch.cuda.is_available() else 0)
        handle = PairModel.options(  # type: ignore[attr-defined]
            name=f"model-{entry.name}",
            ray_actor_options={
                "num_cpus": own.replica_cpus,
                "num_gpus": gpus,
                **({"runtime_env": {"env_vars": env}} if env else {}),
            },
            user_config=batching_knobs(own.model_dump()),
        ).bind(entry.model_dump(), own.model_dump())
        pairs.update(dict.fromkeys(entry.pairs, handle))
    if pooled:  # one deployment for every pooled model; the gateway names the model with each call
        gpus = settings.replica_gpus if settings.replica_gpus is not None else (1 if torch.cuda.is_available() else 0)
        env = replica_env(settings.allocator)
        pool = ModelPool.options(  # type: ignore[attr-defined]
            name=POOL,
            num_replicas=settings.pool_replicas,
            ray_actor_options={
                "num_cpus": settings.replica_cpus,
                "num_gpus": gpus,
                **({"runtime_env": {"env_vars": env}} if env else {}),
            },
            user_config=batching_knobs(settings.model_dump()),
        ).bind([e.model_dump() for e in pooled], settings.model_dump())
        for entry in pooled:
            pairs.update(dict.fromkeys(entry.pairs, pool))
    gateway = Gateway.options(num_replicas=settings.gateway_replicas)  # type: ignore[attr-defined]
    by_pair = {pair: e.name for e in pooled for pair in e.pairs}
    return gateway.bind(pairs, settings.model_dump(), by_pair)
