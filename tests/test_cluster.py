"""The production path on a real multi-node Ray cluster (loadtests/cluster_faults.py): `ray start` on a
head and two worker nodes with the RayService's environment, deploy/serve_config.yaml deployed with
`serve deploy`. beamserve's JSON errors, loopback-only HAProxy listeners and request logs hold there
from the pods' environment alone; a live batching change costs no request; a worker node SIGKILLed
under load costs no bare 500 and no dropped connection, and its replicas are replaced."""

from __future__ import annotations

import pytest

from .conftest import run_suite

pytestmark = [pytest.mark.slow, pytest.mark.alone]


def test_cluster_cases_pass() -> None:
    run_suite("loadtests/cluster_faults.py", "front,user-config,node-kill", timeout_s=600)
