"""The short cases of the fault suite (loadtests/faults.py) against a real server on 127.0.0.1 in the
default layout: clients that stop sending their bodies neither hold the service up nor go unanswered,
the engine's own process SIGKILLed under load is started again by its replica, and the one replica SIGKILLed
under load (ingress and model together) costs a JSON 503 with Retry-After, never a 500 or a dropped
connection, until another has loaded the model. The split layout's kills (a
model replica, a gateway replica) are `make faults`'; on the production config a worker node, a Gateway
and a model replica killed are tests/test_chaos.py's."""

from __future__ import annotations

import pytest

from .conftest import run_suite

pytestmark = [pytest.mark.slow, pytest.mark.alone]


def test_fault_cases_pass() -> None:
    # One server, the replica's kill last (loadtests/faults.py).
    run_suite(
        "loadtests/faults.py", "--cases", "slow-clients,engine-kill,colocated-kill", "--duration", "8", timeout_s=300
    )
