"""The model pool, end to end: twenty Marian models built here (random weights, each its own seed)
served from two pool replicas that hold four models each, beside a dedicated deployment. Under
concurrent load every pair answers with what its model gives alone, models are evicted and loaded
again, and no replica holds (or runs engines for) more models than its bound. Ray is told the host has
one GPU: the dedicated replica and the pool's two share it."""

from __future__ import annotations

import concurrent.futures
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from model import Translator

from .conftest import free_port, serving, wait_for

pytestmark = pytest.mark.slow

TARGETS = [
    "hr",
    "ga",
    "es",
    "it",
    "pt",
    "nl",
    "sv",
    "da",
    "fi",
    "pl",
    "cs",
    "ro",
    "hu",
    "el",
    "bg",
    "sk",
    "sl",
    "lt",
    "lv",
    "et",
]  # twenty pairs from English
PER_REPLICA = 4
METRICS_PORT = free_port()
TEXTS = ["A dog runs.", "Two men are talking on a bench."]


@pytest.fixture(scope="module")
def twenty(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """en-xx -> a directory holding a small Marian model of its own (its seed the pair's index)."""
    import torch
    import transformers

    from .test_marian_layouts import save_marian, small_config

    vocab = json.loads((tiny_dir / "vocab.json").read_text(encoding="utf-8"))
    config = small_config(vocab_size=len(vocab), pad_token_id=vocab["<pad>"], decoder_start_token_id=vocab["<pad>"])
    root = tmp_path_factory.mktemp("twenty")
    out = {}
    for i, target in enumerate(TARGETS):
        path = save_marian(config, root / f"en-{target}", tiny_dir, vocab)
        torch.manual_seed(100 + i)  # save_marian seeds alike: give each model weights of its own
        transformers.MarianMTModel(config).save_pretrained(path)
        out[f"en-{target}"] = path
    return out


@pytest.fixture(scope="module")
def pooled(twenty: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    registry: list[dict[str, Any]] = [{"name": "en-de", "path": "en-de", "sources": ["en"], "targets": ["de"]}]
    registry += [
        {"name": pair, "path": str(path), "sources": ["en"], "targets": [pair[3:]], "pool": True}
        for pair, path in twenty.items()
    ]
    env = {
        "BEAMSERVE_MODEL_REGISTRY": json.dumps(registry),
        "BEAMSERVE_POOL_REPLICAS": "2",
        "BEAMSERVE_POOL_MODELS_PER_REPLICA": str(PER_REPLICA),
        "BEAMSERVE_REPLICA_CPUS": "0.5",
        "BEAMSERVE_CACHE_ENTRIES": "0",  # every request reaches a model
        # Eight requests at once for cold models on one core: loads queue behind loads, longer on a busy
        # host. These tests check answers, not how soon they come.
        "BEAMSERVE_REQUEST_TIMEOUT_S": "150",
        "BEAMSERVE_MAX_QUEUE_WAIT_S": "3600",
        "BEAMSERVE_NUM_GPUS": "1",  # a declared resource: Ray places by it, the replicas run on the CPU
        "RAY_metrics_report_interval_ms": "500",
    }
    with serving(env, metrics_port=METRICS_PORT) as (url, _):
        yield url


def pool_replicas(url: str, expected: int = 2, timeout_s: float = 30.0) -> dict[str, dict[str, Any]]:
    """Each pool replica's last report, asked through every pooled pair until `expected` replicas have
    answered (Serve picks the replica of each call; an idle pair of them may take turns unevenly)."""
    seen: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    while len(seen) < expected and time.monotonic() < deadline:
        for model in httpx.get(f"{url}/v1/models", timeout=30).json()["models"]:
            if model.get("pool"):
                seen[model["pool"]["replica"]] = model["pool"]
    return seen


def test_twenty_pairs_from_a_pool_answer_as_their_models_alone(pooled: str, twenty: dict[str, Path]) -> None:
    expected = {p: [r.hypotheses[0] for r in Translator.load(d, "cpu").translate(TEXTS)] for p, d in twenty.items()}
    models = {m["name"]: m for m in httpx.get(f"{pooled}/v1/models", timeout=30).json()["models"]}
    assert set(models) == {*twenty, "en-de"} and all(models[p]["model"] == p and models[p]["pool"] for p in twenty)
    assert models["en-de"]["pool"] is None and models["en-de"]["digest"]  # the dedicated deployment

    def ask(pair: str) -> tuple[str, int, list[str]]:
        body = {"texts": TEXTS, "source": "en", "target": pair[3:], "split_sentences": False}
        r = httpx.post(f"{pooled}/v1/translate", json=body, timeout=180)
        return pair, r.status_code, [t["text"] for t in r.json().get("translations", [])]

    # Two rounds of every pair, eight at a time: far more models than the eight the pool holds, so the
    # second round finds most evicted and loads them again.
    work = list(twenty) * 2
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, work))
        dedicated = httpx.post(
            f"{pooled}/v1/translate", json={"texts": ["A dog."], "source": "en", "target": "de"}, timeout=180
        )
    assert dedicated.status_code == 200
    for pair, status, texts in answers:
        assert status == 200 and texts == expected[pair], pair

    replicas = pool_replicas(pooled)
    assert len(replicas) == 2
    assert sum(r["loads"] for r in replicas.values()) >= len(twenty)
    assert sum(r["evictions"] for r in replicas.values()) >= len(twenty) - 2 * PER_REPLICA  # evicted, reloaded
    for report in replicas.values():
        assert len(report["held"]) <= PER_REPLICA and set(report["digests"]) == set(report["held"])
        assert report["engines"] == len(report["held"])  # evicted models' engines have stopped


def test_a_pooled_model_loads_on_demand_while_others_answer(pooled: str) -> None:
    """A cold model's first answer waits for its load, and does not fail; the loaded ones answer meanwhile."""
    replicas = pool_replicas(pooled)
    held = {m for r in replicas.values() for m in r["held"]}
    cold = next(f"en-{t}" for t in TARGETS if f"en-{t}" not in held)
    warm = next(iter(held))

    def ask(pair: str) -> tuple[int, float]:
        start = time.monotonic()
        body = {"texts": TEXTS, "source": "en", "target": pair[3:]}
        return httpx.post(f"{pooled}/v1/translate", json=body, timeout=180).status_code, time.monotonic() - start

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        cold_call = pool.submit(ask, cold)
        warm_calls = [ask(warm) for _ in range(3)]
        assert cold_call.result()[0] == 200
    assert all(status == 200 for status, _ in warm_calls)


def gpus_in_use() -> float | None:
    """Ray's count of the GPU resource its actors hold (its `ray_resources` gauge), once exported."""
    text = httpx.get(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10).text
    for labels, value in re.findall(r"^ray_resources\{([^}]*)\} (\S+)$", text, re.M):
        if 'Name="GPU"' in labels and 'State="USED"' in labels:
            return float(value)
    return None


def test_the_dedicated_model_and_the_pool_replicas_share_one_gpu(pooled: str) -> None:
    # Three replicas need a GPU and Ray has one: a third each. Had each asked for a whole GPU, two would
    # wait for one forever and the server would never have become ready.
    wait_for(lambda: gpus_in_use() is not None, "Ray's resource gauges exported")
    assert gpus_in_use() == pytest.approx(1.0, abs=1e-3)  # 3 x 0.3333: Ray keeps four decimals
