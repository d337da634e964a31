"""Realistic traffic for beamserve: real sentence lengths, single and multi-sentence requests, mixed beam
sizes, both pairs, the LibreTranslate route; every response is checked, not only counted.

    locust -f loadtests/locustfile.py --host http://127.0.0.1:8000 --headless -u 16 -r 4 -t 60s
    BEAMSERVE_STEP_LOAD=1 locust -f loadtests/locustfile.py ...   # climb until p95 or errors break the SLO
"""

from __future__ import annotations

import gzip
import os
import random
from pathlib import Path

from locust import FastHttpUser, LoadTestShape, between, task

DATA = Path(os.environ.get("BEAMSERVE_DATA", Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"))
with gzip.open(DATA / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
    SENTENCES = [line.strip() for line in f if line.strip()]

PAIRS = ["de", "fr"]
BEAMS = [1, 4, 4, 4, 5]
SLO_P95_MS = float(os.environ.get("BEAMSERVE_SLO_P95_MS", "1000"))
SLO_MAX_FAIL_RATIO = float(os.environ.get("BEAMSERVE_SLO_MAX_FAIL_RATIO", "0.01"))


class TranslateUser(FastHttpUser):
    wait_time = between(0.05, 0.3)

    def _translate(self, texts: list[str], name: str) -> None:
        # Past the gateway's cache (random test sentences repeat): the load is the models'.
        body = {
            "texts": texts,
            "source": "en",
            "target": random.choice(PAIRS),
            "beam_size": random.choice(BEAMS),
            "cache": False,
        }
        with self.client.post("/v1/translate", json=body, name=name, catch_response=True) as r:
            if r.status_code != 200:
                r.failure(f"HTTP {r.status_code}: {r.text[:200]}")
                return
            translations = r.json()["translations"]
            if len(translations) != len(texts) or not all(t["text"].strip() for t in translations):
                r.failure("missing or empty translation")

    @task(6)
    def one_sentence(self) -> None:
        self._translate([random.choice(SENTENCES)], "/v1/translate [1]")

    @task(2)
    def several_sentences(self) -> None:
        self._translate(random.sample(SENTENCES, random.randint(2, 8)), "/v1/translate [2-8]")

    @task(1)
    def libretranslate(self) -> None:
        body = {"q": random.choice(SENTENCES), "source": "en", "target": random.choice(PAIRS)}
        with self.client.post("/translate", json=body, name="/translate", catch_response=True) as r:
            if r.status_code != 200 or not str(r.json().get("translatedText", "")).strip():
                r.failure(f"HTTP {r.status_code}: {r.text[:200]}")


class StepLoad(LoadTestShape):
    """Add step_users every step_s seconds; stop when the last step broke the SLO or at max_users."""

    step_users = int(os.environ.get("BEAMSERVE_STEP_USERS", "4"))
    step_s = float(os.environ.get("BEAMSERVE_STEP_SECONDS", "15"))
    max_users = int(os.environ.get("BEAMSERVE_MAX_USERS", "64"))
    use_common_options = True

    def __init__(self) -> None:
        super().__init__()
        self.broken_at: int | None = None

    def tick(self) -> tuple[int, float] | None:
        if not os.environ.get("BEAMSERVE_STEP_LOAD"):
            return None if self.runner is None else self._fixed()
        step = int(self.get_run_time() // self.step_s)
        users = (step + 1) * self.step_users
        if self.broken_at is not None or users > self.max_users:
            return None
        if step > 0 and self._slo_broken():
            self.broken_at = users - self.step_users
            return None
        return users, float(self.step_users)

    def _fixed(self) -> tuple[int, float] | None:
        options = self.runner.environment.parsed_options  # type: ignore[union-attr]
        run_time = getattr(options, "run_time", None) or 60
        if self.get_run_time() > run_time:
            return None
        return options.num_users or 1, options.spawn_rate or 1

    def _slo_broken(self) -> bool:
        total = self.runner.stats.total  # type: ignore[union-attr]
        p95 = total.get_current_response_time_percentile(0.95) or 0.0
        fail_ratio = total.fail_ratio
        return bool(p95 > SLO_P95_MS or fail_ratio > SLO_MAX_FAIL_RATIO)
