"""Start and stop a local Ray instance with the Serve application (used by `beamserve serve` and tests)."""

from __future__ import annotations

import logging
import os
from typing import Any

from service.settings import Settings

OBJECT_STORE_BYTES = 100 * 1024 * 1024  # requests are small; the models load from disk in each replica


def start(settings: Settings, *, app_name: str = "beamserve") -> None:
    """ray.init sized for this machine, Serve's HTTP proxy on settings.host:port, the app deployed."""
    # Local use: Ray 2.59+ turns token authentication on for local clusters; this server binds to
    # loopback by default and needs none (a cluster deployment sets RAY_AUTH_MODE itself).
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray import serve


    cpus = settings.num_cpus or len(os.sched_getaffinity(0))
    pairs = len(settings.model_list())
    if settings.replica_cpus * pairs > cpus:
        # Asking Ray for more CPUs than exist leaves replicas pending forever and serve.run hangs.
        raise ValueError(f"{pairs} model replicas x {settings.replica_cpus} CPUs exceed the {cpus} CPUs given to Ray; "
                         "lower BEAMSERVE_REPLICA_CPUS or raise BEAMSERVE_NUM_CPUS")
    ray.init(
        num_cpus=cpus, include_dashboard=False, object_store_memory=OBJECT_STORE_BYTES,
        _metrics_export_port=settings.metrics_port, configure_logging=True, logging_level=logging.WARNING,
        runtime_env={"env_vars": {"RAY_AUTH_MODE": os.environ["RAY_AUTH_MODE"]}},
    )
    serve.start(http_options={"host": settings.host, "port": settings.port})
    deploy(settings, app_name=app_name)


def deploy(settings: Settings | dict[str, Any], *, app_name: str = "beamserve") -> None:
    """Deploy (or update in place) the application; blocks until every replica is ready."""
    from ray import serve

    from service.app import build_app

    args = settings.model_dump() if isinstance(settings, Settings) else settings
    serve.run(build_app(args), name=app_name, route_prefix="/", blocking=False)


def stop() -> None:
    import ray
    from ray import serve

    serve.shutdown()  # type: ignore[no-untyped-call]
    ray.shutdown()
