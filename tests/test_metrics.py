"""Metrics against the real service: counters and histogram counts match what was sent."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

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


def gauged(metrics: dict[str, list[tuple[dict[str, str], float]]]) -> bool:
    """en-de's replica gauges are in the scrape: its load time, capacity and model info."""
    return (
        total(metrics, "ray_beamserve_model_load_seconds", pair="en-de") > 0
        and total(metrics, "ray_beamserve_decode_slots", pair="en-de") > 0
        and total(metrics, "ray_beamserve_model_info", pair="en-de") == 1
    )


def test_an_idle_replicas_gauges_stay_in_the_scrape(server: str) -> None:
    """Ray's agent drops a gauge not set again within two export intervals (2 s in these tests): a replica
    with no traffic past that still shows its capacity, load time and model info."""
    with httpx.Client(base_url=server, timeout=60) as client:
        body = {"texts": ["A dog sleeps."], "source": "en", "target": "de", "cache": False}
        r = client.post("/v1/translate", json=body)
        assert r.status_code == 200
        idle_from = time.monotonic()
        deadline = idle_from + 20
        while True:
            busy = any(m["active"] or m["queued"] for m in client.get("/v1/stats").json().values())
            if busy:
                idle_from = time.monotonic()
            now = time.monotonic()
            shown = gauged(scrape())
            if (now - idle_from > 4 and shown) or now > deadline:
                break
            time.sleep(0.5)
    assert now - idle_from > 4 and shown


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
        # More sentences than an idle engine decodes as one whole batch (alone_max_sentences): the running batch.
        many = [f"A man with {n} dogs walks past a red car." for n in ("two", "three", "four", "five", "six", "seven")]
        r = client.post("/v1/translate", json={"texts": many, "source": "en", "target": "de", "cache": False})
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
        assert steps > 0  # continuous batching (the default) decoded `many` step by step

    sent_sentences = sum(1 + i % 3 for i in range(5)) + len(many) + 1  # each reaches the engine once
    ok = dict(endpoint="/v1/translate", pair="en-de", status="200")
    expected = {
        ("ray_beamserve_requests_total", tuple(ok.items())): 8,
        ("ray_beamserve_request_latency_seconds_count", tuple(ok.items())): 8,
        ("ray_beamserve_cache_sentences_total", (("pair", "en-de"), ("result", "miss"))): 1,
        ("ray_beamserve_cache_sentences_total", (("pair", "en-de"), ("result", "hit"))): 1,
        ("ray_beamserve_requests_total", (("endpoint", "/v1/translate"), ("pair", "unknown"), ("status", "400"))): 1,
        ("ray_beamserve_source_tokens_total", (("pair", "en-de"),)): usage["source_tokens"],
        ("ray_beamserve_generated_tokens_total", (("pair", "en-de"),)): usage["target_tokens"],
        ("ray_beamserve_batches_total", (("pair", "en-de"),)): batches,
        ("ray_beamserve_batch_sentences_count", (("pair", "en-de"),)): batches,
        ("ray_beamserve_decode_steps_total", (("pair", "en-de"),)): steps,
        ("ray_beamserve_step_rows_count", (("pair", "en-de"),)): steps,
        ("ray_beamserve_queue_wait_seconds_count", (("pair", "en-de"),)): sent_sentences,
    }
    deadline = time.monotonic() + 30  # allow for the export interval
    while True:
        after = scrape()
        got = {key: total(after, key[0], **dict(key[1])) - total(before, key[0], **dict(key[1])) for key in expected}
        if (got == expected and gauged(after)) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert got == expected
    assert total(after, "ray_beamserve_model_load_seconds", pair="en-de") > 0
    assert "ray_beamserve_queued_sentences" in after and "ray_beamserve_active_sentences" in after
    # Capacity beside the work (alerts read ratios), and which weights each replica serves.
    assert total(after, "ray_beamserve_queue_capacity_sentences", pair="en-de") == stats_after["config"]["max_queue"]
    assert total(after, "ray_beamserve_decode_slots", pair="en-de") == stats_after["config"]["decode_slots"]
    [(info, one)] = [(ls, v) for ls, v in after["ray_beamserve_model_info"] if ls["pair"] == "en-de"]
    assert one == 1 and info["digest"] == stats_after["digest"]
    assert (info["compute_type"], info["device"]) == ("float32", "cpu")
    assert "ray_beamserve_gpu_memory_allocated_bytes" in after
    # The latency SLO's alerts read the 1 s bucket by this exact label (deploy/prometheus/alerts.yml).
    assert any(ls.get("le") == "1.0" for ls, _ in after["ray_beamserve_request_latency_seconds_bucket"])
    labels = {k for name, series in after.items() if name.startswith("ray_beamserve_") for ls, _ in series for k in ls}
    assert not labels & {"text", "ip", "client", "request_id"}


def test_prometheus_rules_pass_promtool_and_their_unit_tests() -> None:
    rules = yaml.safe_load((REPO / "deploy/prometheus/alerts.yml").read_text())
    names = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert {
        "BeamserveErrorBudgetBurnFast",
        "BeamserveLatencyBudgetBurnFast",
        "BeamserveQueueNearCapacity",
        "BeamserveShedding",
        "BeamserveModelFailedToLoad",
        "BeamserveReplicaRestarts",
        "BeamserveReplicasPending",
        "BeamserveScrapeDown",
    } <= names
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert "ray_" in rule["expr"] or "beamserve:" in rule["expr"] or "up{" in rule["expr"]
            if "alert" in rule:
                assert rule["labels"]["severity"] in {"warning", "critical"}
    # Every alert is exercised by a unit test (deploy/prometheus/alerts_test.yml).
    tests = yaml.safe_load((REPO / "deploy/prometheus/alerts_test.yml").read_text())
    tested = {t["alertname"] for case in tests["tests"] for t in case["alert_rule_test"]}
    assert names <= tested
    config = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"] and config["scrape_configs"][0]["job_name"] == "beamserve"
    promtool = shutil.which("promtool", path=str(Path(sys.executable).parent)) or shutil.which("promtool")
    assert promtool, "promtool is not installed (make test unpacks it into .venv/bin)"
    for args in (
        ["check", "rules", "alerts.yml"],
        ["check", "config", "prometheus.yml"],
        ["test", "rules", "alerts_test.yml"],
    ):
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
        "queued_sentences",
        "queue_capacity_sentences",
        "active_sentences",
        "decode_slots",
        "rejected_requests_total",
        "expired_sentences_total",
        "model_info",
    ):
        assert f"ray_beamserve_{metric}" in exprs, metric
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    # Per-namespace and per-pair variables, and every beamserve query scoped by both.
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "namespace", "pair"} <= variables
    for use in re.findall(r"ray_beamserve_[a-z_]+\{[^}]*\}|ray_beamserve_[a-z_]+", exprs):
        assert 'namespace=~"$namespace"' in use and 'pair=~"$pair"' in use, use


def test_dashboard_and_alerts_name_only_metrics_the_service_exports() -> None:
    defined = set(re.findall(r'"(beamserve_[a-z_]+)"', (REPO / "service" / "metrics.py").read_text()))
    used = re.findall(
        r"ray_(beamserve_[a-z_]+)",
        (REPO / "deploy/grafana/beamserve-dashboard.json").read_text()
        + (REPO / "deploy/prometheus/alerts.yml").read_text(),
    )
    for name in used:
        assert re.sub(r"_(total|bucket|count|sum)$", "", name) in defined, name
