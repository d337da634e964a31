"""The short cases of the fault suite (loadtests/faults.py) against a real server on 127.0.0.1: a model
replica SIGKILLed under load costs no request, a killed gateway replica costs a JSON 503 (never a
500), and clients that stop sending their bodies neither hold the service up nor go unanswered."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import REPO

pytestmark = pytest.mark.slow


def test_fault_cases_pass() -> None:
    # One server for the three cases (loadtests/faults.py): each begins once the last has recovered.
    proc = subprocess.run(
        [sys.executable, "loadtests/faults.py", "--cases", "replica-kill,gateway-kill,slow-clients", "--duration", "8"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "all checks passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
