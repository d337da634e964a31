"""The short cases of the fault suite (loadtests/faults.py) against a real server on 127.0.0.1: a model
replica SIGKILLed under load costs no request, a killed gateway replica costs a JSON 503 (never a
500), and clients that stop sending their bodies neither hold the service up nor go unanswered."""

from __future__ import annotations

import pytest

from .conftest import run_suite

pytestmark = pytest.mark.slow


def test_fault_cases_pass() -> None:
    # One server for the three cases (loadtests/faults.py): each begins once the last has recovered.
    run_suite("loadtests/faults.py", "replica-kill,gateway-kill,slow-clients", timeout_s=300)
