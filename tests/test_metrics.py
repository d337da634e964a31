"""Metrics against the real service: counters and histogram counts match what was sent."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections import defaultdict

import httpx
import pytest
import yaml

from .conftest import METRICS, REPO

pytestmark = pytest.mark.slow  # starts Ray, a server, worker processes or training

SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ([0-9.eE+-]+|NaN|[+-]Inf)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape() -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for line in httpx.get(METRICS["url"], timeout=10).text.splitlines():
        m = SERIES.match(line)
        if m:
            out[m.group(1)].append((dict(LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return out


def total(metrics: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    return sum(v for ls, v in metrics.get(name, []) if all(ls.get(k) == want for k, want in labels.items()))


def settled(client: httpx.Client) -> dict[str, list[tuple[dict[str, str], float]]]:
    """A scrape taken once the engines are idle and the export has caught up with earlier tests' work."""
    deadline = time.monotonic() + 30
    previous = None
    while time.monotonic() < deadline:
        busy = any(m["active"] or m["queued"] for m in client.get("/v1/stats").json().values())
        now = scrape()
        # The model replicas' series (the gateway's count these very /v1/stats calls).
        model_side = {k: v for k, v in now.items() if k.startswith("ray_beamserve_") and "endpoint" not in str(v)}
        if not busy and model_side == previous:
            break
        previous = model_side
        time.sleep(1.0)  # twice Ray's export interval in these tests
    return now


def test_counters_and_histograms_match_what_was_sent(server: str) -> None:
    texts = ["A dog runs on the beach.", "Two men are talking.", "A girl in a red coat is jumping."]
    with httpx.Client(base_url=server, timeout=60) as client:
        before = settled(client)
        stats_before = client.get("/v1/stats").json()["en-de"]
        usage = {"source_tokens": 0, "target_tokens": 0}
        for i in range(5):  # past the cache: every sentence reaches the engine
            body = {"texts": texts[: 1 + i % 3], "source": "en", "target": "de", "cache": False}
            r = client.post("/v1/translate", json=body)
            assert r.status_code == 200
            for k in usage:
                usage[k] += r.json()["usage"][k]
        # A sentence new to the cache, twice: looked up and missed, decoded; then a hit the engine never sees.
        for _ in range(2):
            body = {"texts": ["A grey cat sleeps on a green sofa."], "source": "en", "target": "de"}
            r = client.post("/v1/translate", json=body)
            assert r.status_code == 200
        for k in usage:
            usage[k] += r.json()["usage"][k]
        assert client.post("/v1/translate", json={"texts": ["x"], "source": "en", "target": "xx"}).status_code == 400
        stats_after = client.get("/v1/stats").json()["en-de"]
        batches = stats_after["batches"] - stats_before["batches"]
        steps = stats_after["steps"] - stats_before["steps"]
        assert steps > 0  # continuous batching (the default) decoded them step by step

    ok = dict(endpoint="/v1/translate", pair="en-de", status="200")
    expected = {
        ("ray_beamserve_requests_total", tuple(ok.items())): 7,
        ("ray_beamserve_request_latency_seconds_count", tuple(ok.items())): 7,
        ("ray_beamserve_cache_lookups_total", (("pair", "en-de"), ("result", "miss"))): 1,
        ("ray_beamserve_cache_lookups_total", (("pair", "en-de"), ("result", "hit"))): 1,
        ("ray_beamserve_requests_total", (("endpoint", "/v1/translate"), ("pair", "unknown"), ("status", "400"))): 1,
        ("ray_beamserve_source_tokens_total", (("pair", "en-de"),)): usage["source_tokens"],
        ("ray_beamserve_generated_tokens_total", (("pair", "en-de"),)): usage["target_tokens"],
        ("ray_beamserve_batches_total", (("pair", "en-de"),)): batches,
        ("ray_beamserve_batch_sentences_count", (("pair", "en-de"),)): batches,
        ("ray_beamserve_decode_steps_total", (("pair", "en-de"),)): steps,
        ("ray_beamserve_step_rows_count", (("pair", "en-de"),)): steps,
        ("ray_beamserve_queue_wait_seconds_count", (("pair", "en-de"),)): sum(1 + i % 3 for i in range(5)) + 1,
    }
    deadline = time.monotonic() + 30  # allow for the export interval
    while True:
        after = scrape()
        got = {key: total(after, key[0], **dict(key[1])) - total(before, key[0], **dict(key[1])) for key in expected}
        if got == expected or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert got == expected
    assert total(after, "ray_beamserve_model_load_seconds", pair="en-de") > 0
    assert "ray_beamserve_queue_depth" in after and "ray_beamserve_active_sentences" in after
    assert "ray_beamserve_gpu_memory_allocated_bytes" in after
    labels = {k for name, series in after.items() if name.startswith("ray_beamserve_") for ls, _ in series for k in ls}
    assert not labels & {"text", "ip", "client", "request_id"}


def test_prometheus_rules_and_config_check() -> None:
    rules = yaml.safe_load((REPO / "deploy/prometheus/alerts.yml").read_text())
    names = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert names == {
        "BeamserveHighP95Latency",
        "BeamserveQueueSaturated",
        "BeamserveHigh5xxRate",
        "BeamserveNoReplicasReady",
    }
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert rule["expr"].strip() and rule["labels"]["severity"] in {"warning", "critical"}
            assert "ray_" in rule["expr"]
    config = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"] and config["scrape_configs"][0]["job_name"] == "beamserve"
    promtool = shutil.which("promtool")
    if promtool:  # Debian's `prometheus` package; structural checks above run either way
        for args in (["check", "rules", "alerts.yml"], ["check", "config", "prometheus.yml"]):
            proc = subprocess.run([promtool, *args], cwd=REPO / "deploy/prometheus", capture_output=True, text=True)
            assert proc.returncode == 0, proc.stdout + proc.stderr


def test_grafana_dashboard_covers_the_operator_questions() -> None:
    import json

    dash = json.loads((REPO / "deploy/grafana/beamserve-dashboard.json").read_text())
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    for metric in (
        "requests_total",
        "request_latency_seconds_bucket",
        "source_tokens_total",
        "generated_tokens_total",
        "batch_sentences_bucket",
        "queue_depth",
        "active_sentences",
        "rejected_total",
        "timeouts_total",
    ):
        assert f"ray_beamserve_{metric}" in exprs, metric
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
