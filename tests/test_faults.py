"""The short cases of the fault suite (loadtests/faults.py) against real servers on 127.0.0.1: a model
replica SIGKILLed under load costs no request, a killed gateway replica costs a JSON 503 (never a
500), as does the one replica of a colocated server until another has loaded the model, and clients
that stop sending their bodies neither hold the service up nor go unanswered."""

from __future__ import annotations

import pytest

from .conftest import run_suite

pytestmark = pytest.mark.slow


def test_fault_cases_pass() -> None:
    # One server for the first three cases (loadtests/faults.py), each begun once the last has recovered;
    # the colocated layout's kill on a server of its own.
    run_suite("loadtests/faults.py", "replica-kill,gateway-kill,slow-clients,colocated-kill", timeout_s=420)
