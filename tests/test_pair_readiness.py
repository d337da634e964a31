"""Readiness per pair, end to end: `beamserve serve` with one good model and one whose weights are
corrupt. The server starts and serves the good pair; the broken pair answers its own requests 503
(pair_unavailable) at once; /readyz stays 200 for the pod and reports each pair, cheaply."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import REPO, serving

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def half_broken(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    broken = Path(tmp_path_factory.mktemp("models")) / "en-fr"
    shutil.copytree(REPO / "model" / "pretrained" / "en-fr", broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # a truncated download
    log = Path(tmp_path_factory.mktemp("log")) / "stderr.txt"
    with serving({"BEAMSERVE_MODELS": f"en-de,{broken}"}, stderr=log) as (url, _):
        yield url, log.read_text()


def test_a_pair_that_cannot_load_is_named_and_the_server_serves_the_others(half_broken: tuple[str, str]) -> None:
    url, stderr = half_broken
    assert "model-en-fr failed to deploy" in stderr and "SafetensorError" in stderr
    r = httpx.post(f"{url}/v1/translate", json={"texts": ["A dog runs."], "source": "en", "target": "de"}, timeout=30)
    assert r.status_code == 200 and r.json()["translations"][0]["text"]


def test_the_broken_pair_fails_its_own_requests_with_503_at_once(half_broken: tuple[str, str]) -> None:
    url, _ = half_broken
    body = {"texts": ["A dog runs."], "source": "en", "target": "fr"}
    start = time.monotonic()
    r = httpx.post(f"{url}/v1/translate", json=body, timeout=30)
    assert time.monotonic() - start < 2.0  # not the request timeout
    assert r.status_code == 503 and r.json()["error"] == "pair_unavailable" and r.headers["retry-after"] == "5"
    assert r.json()["request_id"] == r.headers["x-request-id"]
    libre = httpx.post(f"{url}/translate", json={"q": "A dog runs.", "source": "en", "target": "fr"}, timeout=30)
    assert libre.status_code == 503 and "en-fr" in libre.json()["error"]
    models = {m["name"]: m for m in httpx.get(f"{url}/v1/models", timeout=10).json()["models"]}
    assert models["en-de"]["ready"] and models["en-de"]["digest"]
    assert models["en-fr"] == {**models["en-fr"], "ready": False, "digest": None}


def test_readyz_reports_each_pair_and_answers_fast(half_broken: tuple[str, str]) -> None:
    url, _ = half_broken
    for _ in range(5):
        start = time.monotonic()
        r = httpx.get(f"{url}/readyz", timeout=1.0)  # Kubernetes' default probe timeout
        assert time.monotonic() - start < 0.5
        assert r.status_code == 200
        assert r.json() == {"status": "ready", "pairs": {"en-de": "ready", "en-fr": "unavailable"}}
    assert httpx.get(f"{url}/readyz", params={"pair": "en-de"}, timeout=1.0).status_code == 200
    assert httpx.get(f"{url}/readyz", params={"pair": "en-fr"}, timeout=1.0).status_code == 503
    assert httpx.get(f"{url}/readyz", params={"pair": "xx-yy"}, timeout=1.0).status_code == 404
