"""How far the Gateway deployment can spread, read in its replica: the most replicas Serve may run of it (its
autoscaling_config's max_replicas, else num_replicas) and how many hosts the Ray cluster has (nodes by address:
the nodes of one host share its files, as a test's loopback cluster does; each Kubernetes pod is a host of its
own). Outside a Serve replica: one and one."""

from __future__ import annotations

import ray
from ray import serve
from ray.serve.exceptions import RayServeException


def gateways_and_hosts() -> tuple[int, int]:
    try:
        context = serve.get_replica_context()
    except RayServeException:
        return 1, 1
    config = context._deployment_config
    autoscaling = config.autoscaling_config
    most = autoscaling.max_replicas if autoscaling is not None else config.num_replicas
    hosts = {node["NodeManagerAddress"] for node in ray.nodes() if node.get("Alive")}  # type: ignore[no-untyped-call]
    return most or 1, max(1, len(hosts))
