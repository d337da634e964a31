"""The production path on a real multi-node Ray cluster (loadtests/cluster_faults.py): `ray start` on a
head and two worker nodes with the RayService's environment, deploy/serve_config.yaml deployed with
`serve deploy`. beamserve's JSON errors, loopback-only HAProxy listeners and request logs hold there
from the pods' environment alone; a live batching change costs no request; a worker node SIGKILLed
under load costs no bare 500 and no dropped connection, and its replicas are replaced."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import REPO

pytestmark = pytest.mark.slow


def test_cluster_cases_pass() -> None:
    proc = subprocess.run(
        [sys.executable, "loadtests/cluster_faults.py", "--cases", "front,user-config,node-kill", "--duration", "8"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and "all checks passed" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-3000:]
