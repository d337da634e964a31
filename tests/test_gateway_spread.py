"""Where gateways can run on several hosts, an SQLite records file (one host's) is refused at start, naming the
setting; a replica reads how far its deployment can spread from Serve itself."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from service.store.records import DEFAULT_FILE, storage_of, unshared

from .conftest import REPO, one_ray_start_at_a_time

SQLITE = f"sqlite:///{DEFAULT_FILE}"


@pytest.mark.parametrize(
    ("uri", "gateways", "hosts", "refused"),
    [
        (SQLITE, 4, 3, True),  # the chart's Gateway autoscaling over worker pods, with no store configured
        (SQLITE, 2, 2, True),
        (SQLITE, 4, 1, False),  # one host: every gateway opens the same file
        (SQLITE, 1, 5, False),  # one gateway: one file
        ("redis://records:6379/0", 4, 3, False),
        ("valkeys://records:6380/0", 4, 3, False),
    ],
)
def test_an_sqlite_file_is_refused_only_where_gateways_span_hosts(
    uri: str, gateways: int, hosts: int, refused: bool
) -> None:
    why = unshared(uri, gateways, hosts)
    assert (why is not None) == refused
    if why is not None:
        assert "BEAMSERVE_RECORDS_STORAGE" in why and f"{gateways} gateway replicas" in why and f"{hosts} hosts" in why


def test_the_default_store_is_the_limits_redis_else_the_sqlite_file() -> None:
    assert storage_of("", "") == SQLITE
    assert storage_of("", "redis://limits:6379/0") == "redis://limits:6379/0"
    assert storage_of("valkey://records:6379/0", "redis://limits:6379/0") == "valkey://records:6379/0"


PROBE = """
from service import local_ray
local_ray.enter_local_only()
import ray
from ray import serve
from service.api.gateway_spread import gateways_and_hosts
ray.init(address="local", num_cpus=1, include_dashboard=False)
serve.start(http_options={"location": "NoServer"})

@serve.deployment(autoscaling_config={"min_replicas": 1, "max_replicas": 3}, ray_actor_options={"num_cpus": 0})
class Autoscaled:
    def __call__(self):
        return gateways_and_hosts()

@serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0})
class Fixed:
    def __call__(self):
        return gateways_and_hosts()

for name, d in (("autoscaled", Autoscaled), ("fixed", Fixed)):
    print(name, *serve.run(d.bind(), name=name, route_prefix=None).remote().result())
print("outside", *gateways_and_hosts())
serve.shutdown()
ray.shutdown()
"""


@pytest.mark.slow
def test_a_replica_reads_its_deployments_most_replicas_and_the_clusters_hosts() -> None:
    # A fresh process's environment: not the Ray and Serve switches a server started in this one has set.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "BEAMSERVE_"))}
    with one_ray_start_at_a_time():
        done = subprocess.run(
            [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=180, cwd=REPO, env=env
        )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(
        line.split(" ", 1)
        for line in done.stdout.splitlines()
        if line.split(" ")[0] in ("autoscaled", "fixed", "outside")
    )
    assert lines == {"autoscaled": "3 1", "fixed": "2 1", "outside": "1 1"}, done.stdout
