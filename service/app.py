"""The Ray Serve application: one ingress (service/api/gateway.py), one model deployment per model of
the registry (service/registry.py, service/engine/replica.py), each answering its language pairs.
`serve run service.app:build_app` and the Serve config import it.

With one model (Settings.colocate), the ingress holds it instead: one deployment, whose replicas
serve HTTP and decode in one process. Otherwise each model has a deployment of its own: it is always
loaded (the models are small), scales on its own load with its own autoscaling config, and no model
evicts another's weights.
Entries marked `pool` share one multiplexed deployment instead (service/engine/pool.py): many rarely used
models on a few replicas, the least recently used evicted.
"""

import math
from typing import Any

from ray import serve

from service.api.gateway import Gateway
from service.batching import batching_knobs
from service.engine.allocator import replica_env
from service.engine.pool import POOL, ModelPool
from service.engine.replica import PairModel
from service.settings import Settings


def gpu_share(replicas: int, gpus: float) -> float:
    """The GPUs each of `replicas` GPU replicas asks for: a whole GPU while there are enough, else an
    equal fraction that fits them all. Ray places a fractional request within one GPU, so the fraction
    is 1/k with k replicas to a GPU (2 GPUs, 3 replicas: a half each, not two thirds)."""
    if replicas <= 0 or gpus <= 0:
        return 0.0
    return 1.0 if replicas <= gpus else 1 / math.ceil(replicas / gpus)


def cluster_gpus() -> float:
    """GPUs of the Ray cluster the app is built in (without one, this host's CUDA devices)."""
    import ray

    if ray.is_initialized():
        return float(ray.cluster_resources().get("GPU", 0))  # type: ignore[no-untyped-call]
    import torch

    return float(torch.cuda.device_count())


def actor_options(s: Settings, gpus: float) -> dict[str, Any]:
    """What a model replica asks Ray for: its CPUs, its GPUs (replica_gpus when set, else `gpus`, its
    share; none when its device is the CPU), and the allocator's environment."""
    share = s.replica_gpus if s.replica_gpus is not None else 0.0 if s.device == "cpu" else gpus
    env = replica_env(s.allocator)
    return {"num_cpus": s.replica_cpus, "num_gpus": share, **({"runtime_env": {"env_vars": env}} if env else {})}


def gpu_replicas(settings: Settings) -> int:
    """Model-holding replicas whose GPUs are left to the default: one per dedicated model (or, colocated,
    each gateway replica), the pool's replicas."""
    found = settings.entries()
    dedicated = [settings.for_entry(e) for e in found if not e.pool]
    needs = (
        [colocated_settings(settings, dedicated)] * settings.gateway_replicas
        if settings.uses_colocation(found)
        else dedicated
    )
    needs += [settings] * settings.pool_replicas if any(e.pool for e in found) else []
    return sum(s.replica_gpus is None and s.device != "cpu" for s in needs)


def colocated_settings(settings: Settings, dedicated: list[Settings]) -> Settings:
    """What a replica holding every dedicated model asks for: its one model's settings, or with several,
    the sum of their CPUs and the GPUs of the one that asks most (a fractional GPU is shared)."""
    if len(dedicated) == 1:
        return dedicated[0]
    gpus = [s.replica_gpus for s in dedicated if s.replica_gpus is not None]
    return settings.model_copy(
        update={
            "replica_cpus": sum(s.replica_cpus for s in dedicated),
            "replica_gpus": max(gpus) if gpus else None,
            "device": "cpu" if all(s.device == "cpu" for s in dedicated) else settings.device,
        }
    )


def gateway_logging(s: Settings) -> dict[str, Any]:
    """The gateway's Serve logging: WARNING unless DEBUG is asked. Its INFO lines would be Serve's
    access line for each request, which beamserve's request line replaces (service/request_log.py) and
    which Serve builds even with the access log off (then drops): at WARNING the logger skips it."""
    level = "DEBUG" if s.log_level == "DEBUG" else "WARNING" if s.log_level == "INFO" else s.log_level
    return {"encoding": s.log_encoding, "log_level": level, "enable_access_log": False}


def build_app(args: dict[str, Any] | None = None) -> serve.Application:
    """Application builder for `serve run service.app:build_app` and the Serve config's import_path.

    args (all optional) are Settings fields, e.g. {"models": "en-de,en-fr", "replica_cpus": 1}.
    """
    settings = Settings(**(args or {}))
    pairs: dict[str, Any] = {}
    found = settings.entries()
    pooled = [e for e in found if e.pool]
    dedicated = [e for e in found if not e.pool]
    share = gpu_share(gpu_replicas(settings), cluster_gpus())
    gateway: dict[str, Any] = {"num_replicas": settings.gateway_replicas, "logging_config": gateway_logging(settings)}
    local = dedicated if settings.uses_colocation(found) else []
    if local:  # the ingress holds them: its replicas ask for what the models need, and take their knobs
        own = colocated_settings(settings, [settings.for_entry(e) for e in local])
        gateway |= {"ray_actor_options": actor_options(own, share), "user_config": batching_knobs(own.model_dump())}
    for entry in [] if local else dedicated:  # each its own deployment
        own = settings.for_entry(entry)
        handle = PairModel.options(  # type: ignore[attr-defined]
            name=f"model-{entry.name}",
            ray_actor_options=actor_options(own, share),
            user_config=batching_knobs(own.model_dump()),
        ).bind(entry.model_dump(), own.model_dump())
        pairs.update(dict.fromkeys(entry.pairs, handle))
    if pooled:  # one deployment for every pooled model; the gateway names the model with each call
        pool = ModelPool.options(  # type: ignore[attr-defined]
            name=POOL,
            num_replicas=settings.pool_replicas,
            ray_actor_options=actor_options(settings, share),
            user_config=batching_knobs(settings.model_dump()),
        ).bind([e.model_dump() for e in pooled], settings.model_dump())
        for entry in pooled:
            pairs.update(dict.fromkeys(entry.pairs, pool))
    by_pair = {pair: e.name for e in pooled for pair in e.pairs}
    held = [e.model_dump() for e in local]
    return Gateway.options(**gateway).bind(pairs, settings.model_dump(), by_pair, held)  # type: ignore[attr-defined]
