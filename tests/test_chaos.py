"""The production path on a real multi-node Ray cluster, in the chaos run's short form (loadtests/chaos.py;
`make chaos` runs it for twenty minutes): `ray start` on a head and two worker nodes with the RayService's
environment, deploy/serve_config.yaml deployed with `serve deploy`, API keys counted in the records store.
beamserve's JSON errors, loopback-only HAProxy listeners and request logs hold from the pods' environment
alone; a 5 MB Word file uploaded to one Gateway replica is downloaded through another; then a minute of
texts, glossaries and documents while the batching knobs change live, a Gateway replica, a worker node and
a model replica are SIGKILLed and the records store and the head restart: no bare 500 or non-JSON 5xx,
every accepted document done or failed and billed once or not at all, every glossary kept, and every
recovery under 30 s."""

from __future__ import annotations

import pytest

from .conftest import run_suite

pytestmark = [pytest.mark.slow, pytest.mark.alone]


def test_the_chaos_run_loses_nothing() -> None:
    run_suite("loadtests/chaos.py", "--minutes", "1", "--rounds", "1", timeout_s=600)
