"""The JSON logs of a real server: one summary line per request, with its counts and times, the
request id that the client and the error body see, and never the text itself."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow

FIELDS = {
    "request_id",
    "route",
    "method",
    "status",
    "pair",
    "texts",
    "characters",
    "sentences",
    "cached_sentences",
    "queue_wait_s",
    "decode_s",
    "duration_s",
    "client",
}


def summaries(ids: set[str], timeout_s: float = 10.0) -> dict[str, list[dict[str, Any]]]:
    """The summary lines of these request ids in the gateway replicas' requests files."""
    import ray

    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs" / "serve"
    deadline = time.monotonic() + timeout_s
    while True:
        found: dict[str, list[dict[str, Any]]] = {i: [] for i in ids}
        for path in logs.glob("requests_beamserve_Gateway_*.log"):
            for line in path.read_text().splitlines():
                record = json.loads(line)  # every line is JSON
                if record.get("beamserve") == "request" and record.get("request_id") in ids:
                    found[record["request_id"]].append(record)
        if all(found.values()) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_one_json_summary_line_per_request_with_counts_and_no_text(server: str) -> None:
    secret = "Zebras quietly juggle seventeen umbrellas."  # must not reach the logs
    calls = {
        "ok": ("/v1/translate", {"texts": [secret, "A dog runs. A cat sleeps."], "source": "en", "target": "de"}),
        "cached": ("/v1/translate", {"texts": [secret], "source": "en", "target": "de"}),
        "libre": ("/translate", {"q": "Two men talk.", "source": "en", "target": "fr"}),
        "bad_pair": ("/v1/translate", {"texts": [secret], "source": "en", "target": "xx"}),
        "invalid": ("/v1/translate", {"texts": [], "source": "en", "target": "de"}),
    }
    ids = {name: f"test-{name}-{uuid.uuid4().hex[:8]}" for name in calls}
    answers = {}
    for name, (path, body) in calls.items():
        answers[name] = httpx.post(f"{server}{path}", json=body, headers={"X-Request-ID": ids[name]}, timeout=60)
        assert answers[name].headers["x-request-id"] == ids[name]
    for name in ("bad_pair", "invalid"):  # the error body names the request the logs name
        assert answers[name].json()["request_id"] == ids[name]

    found = summaries(set(ids.values()))
    lines = {name: found[ids[name]] for name in ids}
    assert all(len(got) == 1 for got in lines.values()), lines  # one line per request
    rec = {name: got[0] for name, got in lines.items()}
    for record in rec.values():
        assert record.keys() >= FIELDS
        assert secret not in json.dumps(record)
    ok = rec["ok"]
    assert (ok["status"], ok["route"], ok["method"], ok["pair"]) == (200, "/v1/translate", "POST", "en-de")
    assert (ok["texts"], ok["characters"], ok["sentences"]) == (2, len(secret) + 25, 3)
    assert ok["decode_s"] > 0 and ok["queue_wait_s"] >= 0 and ok["duration_s"] >= ok["decode_s"]
    assert (rec["cached"]["sentences"], rec["cached"]["cached_sentences"], rec["cached"]["decode_s"]) == (1, 1, 0.0)
    assert (rec["libre"]["route"], rec["libre"]["pair"], rec["libre"]["texts"]) == ("/translate", "en-fr", 1)
    assert (rec["bad_pair"]["status"], rec["invalid"]["status"]) == (400, 422)
    assert rec["ok"]["client"] == "anonymous"
