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


def summaries(
    ids: set[str], timeout_s: float = 10.0, files: str = "requests_beamserve_Gateway_*.log"
) -> dict[str, list[dict[str, Any]]]:
    """The summary lines of these request ids in the gateway replicas' requests files (or `files`)."""
    import ray

    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs" / "serve"
    deadline = time.monotonic() + timeout_s
    while True:
        found: dict[str, list[dict[str, Any]]] = {i: [] for i in ids}
        for path in logs.glob(files):
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


def test_an_answer_haproxy_makes_itself_is_a_line_of_the_front_s_requests_file(server: str) -> None:
    rid = f"test-front-{uuid.uuid4().hex[:8]}"
    headers = {"X-Request-ID": rid, **{f"x-extra-{i}": "1" for i in range(120)}}  # past the front's 100 fields
    r = httpx.post(f"{server}/v1/translate", json={"texts": ["A dog."], "target": "de"}, headers=headers, timeout=10)
    assert r.status_code == 431 and r.json()["request_id"] == rid
    [line] = summaries({rid}, files="requests_haproxy_*.log")[rid]
    assert line["status"] == 431 and line["route"] == "/v1/translate" and line["method"] == "POST"
    assert line["front"] == "haproxy" and line["beamserve"] == "request"
    assert summaries({rid}, timeout_s=0)[rid] == []  # no gateway saw it


def test_a_client_s_error_is_its_summary_line_not_an_error_in_a_replica_s_log(server: str) -> None:
    import ray

    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs" / "serve"
    replica_logs = list(logs.glob("replica_beamserve_model-en-de_*.log"))
    before = {path: path.stat().st_size for path in replica_logs}
    calls = {  # refused in the model's replica: a text longer than the model takes, a deadline missed
        "too_long": {"texts": ["a " * 990], "source": "en", "target": "de", "split_sentences": False},
        "deadline": {
            "texts": ["Two men are talking on a bench. " * 8],
            "source": "en",
            "target": "de",
            "timeout_s": 0.001,
        },
    }
    ids = {name: f"test-{name}-{uuid.uuid4().hex[:8]}" for name in calls}
    for name, body in calls.items():
        r = httpx.post(f"{server}/v1/translate", json=body, headers={"X-Request-ID": ids[name]}, timeout=60)
        assert r.status_code == {"too_long": 422, "deadline": 504}[name], r.text
        if r.status_code == 504:
            assert r.headers["retry-after"] == "1"
    found = summaries(set(ids.values()))
    assert [found[ids["too_long"]][0]["status"], found[ids["deadline"]][0]["status"]] == [422, 504]
    written = "".join(path.read_text()[before[path] :] for path in replica_logs)
    errors = [line for line in written.splitlines() if '"levelname": "ERROR"' in line or "Traceback" in line]
    assert not errors, errors[:3]


def test_a_line_stays_one_line_whatever_its_strings_hold(tmp_path: Path) -> None:
    from service.request_log import RequestFile

    odd = "/download_file/\x85\u2028\u2029\n\x1c/é"  # a fuzzer's path: line ends of every reader's kind
    log = RequestFile(tmp_path / "requests.log")
    log.write({"route": odd})
    log.write({"route": "/v1/translate"})
    lines = (tmp_path / "requests.log").read_text().splitlines()
    assert [json.loads(line)["route"] for line in lines] == [odd, "/v1/translate"]


def test_a_route_with_an_id_or_a_secret_in_its_path_is_logged_as_its_template(server: str) -> None:
    rid = f"test-download-{uuid.uuid4().hex[:8]}"
    r = httpx.get(f"{server}/download_file/ABC-{'9' * 48}/notes.txt", headers={"X-Request-ID": rid}, timeout=10)
    assert r.status_code == 404
    [line] = summaries({rid})[rid]
    assert line["route"] == "/download_file/{handle}/{filename}" and "9" * 48 not in json.dumps(line)
