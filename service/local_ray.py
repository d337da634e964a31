"""A local Ray instance that nothing on another host can reach.

Ray binds its GCS, raylet, workers, agents and metrics exporter to the node's address; with
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (Ray's local-only mode, the default on macOS and Windows) that
address is 127.0.0.1. Serve's inter-deployment gRPC server in each replica is the one listener Ray
hard-wires to every interface; `pin_replica_grpc()` moves it to loopback. Ray's token
authentication stays on besides (Ray generates the token), so other users of the same host cannot
drive the instance either.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from collections.abc import Callable
from typing import Any

LOCAL_ONLY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def enter_local_only() -> None:
    """Before `import ray`: Ray reads the switch when its constants module loads; children inherit it."""
    os.environ.update(LOCAL_ONLY_ENV)
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:  # ray already imported in this process: it read the switch then
        constants.ENABLE_RAY_CLUSTER = False  # type: ignore[attr-defined]
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        raise ValueError("RAY_AUTH_MODE=disabled: beamserve keeps Ray's token authentication on; unset it")


def pin_replica_grpc() -> None:
    """In a replica process of a loopback-only instance, bind Serve's inter-deployment gRPC server to
    127.0.0.1 instead of [::] (it starts after the deployment's __init__, which calls this)."""
    import ray
    from ray.serve._private import replica

    if not is_loopback(ray.util.get_node_ip_address()):  # type: ignore[no-untyped-call]
        return  # a real cluster: other nodes' proxies and replicas call this server
    original: Callable[[Any, str], int] = getattr(replica, "add_port_to_grpc_server")  # noqa: B009 (not exported)
    if getattr(original, "pinned_to_loopback", False):
        return

    def add_port(server: Any, address: str) -> int:
        if address.startswith("[::]:"):
            address = "127.0.0.1:" + address.removeprefix("[::]:")
        return original(server, address)

    add_port.pinned_to_loopback = True  # type: ignore[attr-defined]
    setattr(replica, "add_port_to_grpc_server", add_port)  # noqa: B010
