"""The Ray Serve application: one ingress (service/gateway.py), one model deployment per language
pair (service/replica.py). `serve run service.app:build_app` and the Serve config import it.

One deployment per pair (not model multiplexing): each pair is always loaded (the models are small),
scales on its own load with its own autoscaling config, and a pair's replicas never evict each
other's weights, which multiplexing's per-replica LRU would do under mixed traffic.
"""

from typing import Any

from ray import serve

from service.allocator import replica_env
from service.gateway import Gateway
from service.replica import PairModel, pair_of
from service.scheduler import batching_knobs
from service.settings import Settings


def build_app(args: dict[str, Any] | None = None) -> serve.Application:
    """Application builder for `serve run service.app:build_app` and the Serve config's import_path.

    args (all optional) are Settings fields, e.g. {"models": "en-de,en-fr", "replica_cpus": 1}.
    """
    settings = Settings(**(args or {}))
    import torch

    gpus = settings.replica_gpus if settings.replica_gpus is not None else (1 if torch.cuda.is_available() else 0)
    env = replica_env(settings.allocator)
    pairs: dict[str, Any] = {}
    for model in settings.model_list():
        pair = pair_of(model)
        pairs[pair] = PairModel.options(  # type: ignore[attr-defined]
            name=f"model-{pair}",
            ray_actor_options={
                "num_cpus": settings.replica_cpus,
                "num_gpus": gpus,
                **({"runtime_env": {"env_vars": env}} if env else {}),
            },
            user_config=batching_knobs(settings.model_dump()),
        ).bind(model, settings.model_dump())
    gateway = Gateway.options(num_replicas=settings.gateway_replicas)  # type: ignore[attr-defined]
    return gateway.bind(pairs, settings.model_dump())
