"""Start and stop a local Ray instance with the Serve application (used by `beamserve serve` and tests)."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from model.kernels.cpus import usable_cpus
from service import local_ray
from service.api import front
from service.metrics_relay import MetricsRelay
from service.settings import Settings

OBJECT_STORE_BYTES = 100 * 1024 * 1024  # requests are small; the models load from disk in each replica
_RELAY: list[MetricsRelay] = []  # the metrics relay of the instance this process started, if any


def free_loopback_port() -> int:
    """A loopback port free now, below the kernel's ephemeral range: Ray's processes take dozens of
    ports the kernel assigns from that range, so one handed out from it here could be taken by a Ray
    worker before its owner binds it."""
    low = _ephemeral_low()
    for port in random.sample(range(low // 2, low), 64):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # in use
                continue
            return port
    with socket.socket() as s:  # all 64 taken: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):  # not Linux
        return 32768


WORKER_NICENESS = "RAY_worker_niceness"  # read by Ray's raylet when it starts a worker process


def taken(host: str, port: int) -> bool:
    """Whether something listens on host:port already (a bind as a server's, which reuses TIME_WAIT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def with_free_ports(settings: Settings, say: Callable[[str], None]) -> Settings:
    """The settings with ports that can be had: ValueError naming a port taken that the user named (the API's
    always: its clients know it); where the metrics port was left to its default and is taken (another
    server on this host), a free one, said."""
    if taken(settings.host, settings.port):
        raise ValueError(
            f"port {settings.port} on {settings.host} is in use (--port, BEAMSERVE_PORT): stop what listens "
            "there or choose another"
        )
    if taken(settings.metrics_host, settings.metrics_port):
        if "metrics_port" in settings.model_fields_set:
            raise ValueError(
                f"metrics port {settings.metrics_port} on {settings.metrics_host} is in use (--metrics-port, "
                "BEAMSERVE_METRICS_PORT): stop what listens there or choose another"
            )
        chosen = free_loopback_port()
        say(f"metrics port {settings.metrics_port} is in use; metrics on {chosen} (BEAMSERVE_METRICS_PORT sets it)")
        settings = settings.model_copy(update={"metrics_port": chosen})
    return settings


def start(settings: Settings, *, app_name: str = "beamserve", say: Callable[[str], None] = print) -> Settings:
    """ray.init sized for this machine, Serve's HTTP front on settings.host:port, the app deployed; returns the
    settings it runs with (with_free_ports)."""
    settings = with_free_ports(settings, say)
    # Every port Ray opens on loopback, its token authentication on (service/local_ray.py).
    local_ray.enter_local_only()
    # The front's switches and limits, read by Ray's processes (service/api/front.py).
    os.environ.update(front.environment(settings.proxy, front.limits_of(settings)))
    # Ray starts its workers at nice 15, below its own daemons: the model replicas would yield their cores to the
    # client, HAProxy's children and anything else on the machine. The replicas are the service (one request at a
    # time answered about 1.4 ms sooner at nice 0 on a busy 2-core machine); a setting already made stays.
    os.environ.setdefault(WORKER_NICENESS, "0")
    # HAProxy's stats page and exporter (on loopback) on ports of this instance's, not Serve's fixed ones.
    os.environ["RAY_SERVE_HAPROXY_STATS_PORT"] = str(free_loopback_port())
    os.environ["RAY_SERVE_HAPROXY_METRICS_PORT"] = str(free_loopback_port())
    import ray
    from ray import serve

    cpus = settings.num_cpus or usable_cpus()
    found = settings.entries()
    wanted = sum(settings.for_entry(e).replica_cpus for e in found if not e.pool)
    wanted += settings.pool_replicas * settings.replica_cpus if any(e.pool for e in found) else 0
    if wanted > cpus + 1e-6:  # fractions of a CPU add up with rounding
        # Asking Ray for more CPUs than exist leaves replicas pending forever and serve.run hangs.
        raise ValueError(
            f"the model replicas ask for {wanted:g} CPUs, more than the {cpus} given to Ray; "
            "lower BEAMSERVE_REPLICA_CPUS (or an entry's replica_cpus) or raise BEAMSERVE_NUM_CPUS"
        )
    # Ray exports metrics on loopback only; another metrics host gets a relay (service/metrics_relay.py).
    relayed = settings.metrics_host != "127.0.0.1"
    export_port = free_loopback_port() if relayed else settings.metrics_port
    ray.init(
        # An instance of its own: without it ray.init joins the cluster RAY_ADDRESS or a `ray start` names.
        address="local",
        num_cpus=cpus,
        num_gpus=settings.num_gpus,
        include_dashboard=False,
        object_store_memory=OBJECT_STORE_BYTES,
        _metrics_export_port=export_port,
        configure_logging=True,
        logging_level=logging.WARNING,
        # In every worker, the proxy's and HAProxy manager's among them: JSON errors, the front's limits.
        runtime_env={"worker_process_setup_hook": front.SETUP_HOOK},
    )
    if relayed:
        _RELAY.append(MetricsRelay(settings.metrics_host, settings.metrics_port, export_port).start())
    serve.start(http_options={"host": settings.host, "port": settings.port})
    deploy(settings, app_name=app_name, say=say)
    return settings


def deploy(
    settings: Settings | dict[str, Any], *, app_name: str = "beamserve", say: Callable[[str], None] = print
) -> None:
    """Deploy (or update in place) the application; blocks until every replica is ready. A pair whose
    model fails to load does not stop the others: it is named (say) and answers 503 while the gateway
    and the other pairs serve. Raises when the gateway, or every pair, failed."""
    from ray import serve

    from service.app import build_app

    args = settings.model_dump() if isinstance(settings, Settings) else settings
    s = Settings(**args)
    # beamserve's summary line is the one line per request (service/request_log.py): no access line beside it.
    logging_config = {"encoding": s.log_encoding, "log_level": s.log_level, "enable_access_log": False}
    try:
        serve.run(build_app(args), name=app_name, route_prefix="/", blocking=False, logging_config=logging_config)
    except RuntimeError:
        deployments = serve.status().applications[app_name].deployments
        failed = {name: d.message for name, d in deployments.items() if d.status != "HEALTHY"}
        if "Gateway" in failed or len(failed) >= len(deployments) - 1:  # the gateway, or every model
            raise
        for name, message in failed.items():
            say(f"warning: {name} failed to deploy; its pair answers 503 (pair_unavailable) until it is fixed:")
            say(f"  {message.strip().splitlines()[-1] if message.strip() else '(no message)'}")


def drain_and_stop(timeout_s: float, *, app_name: str = "beamserve", say: Callable[[str], None] = print) -> int:
    """Refuse new translations, wait up to timeout_s for the accepted ones to be answered, then stop
    Serve and Ray; returns how many were still in flight at the end. The handle calls and Serve's
    shutdown share one event loop: in Serve's high-throughput mode a handle's router runs on the loop
    of its first caller, and is shut down on it."""
    from ray import serve

    async def drained() -> int:
        gateway = serve.get_deployment_handle("Gateway", app_name=app_name)
        left = int(await asyncio.wait_for(gateway.drain.remote(), 10))
        deadline = time.monotonic() + timeout_s
        if left:
            say(f"draining: {left} translation requests in flight")
        while left and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            left = int(await asyncio.wait_for(gateway.translations_in_flight.remote(), 10))
        say(f"stopping ({left} requests unfinished after {timeout_s:.0f}s) ..." if left else "stopping ...")
        await serve.shutdown_async()  # type: ignore[no-untyped-call]
        return left

    left = asyncio.run(drained())
    stop()
    return left


def stop() -> None:
    import ray
    from ray import serve

    serve.shutdown()  # type: ignore[no-untyped-call]
    ray.shutdown()
    while _RELAY:
        _RELAY.pop().stop()
