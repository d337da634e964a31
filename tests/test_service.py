"""The HTTP service, end to end: real Ray Serve on 127.0.0.1 with the shipped models, real HTTP."""

from __future__ import annotations

import asyncio
import csv
import gzip
import html
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from ray.serve._private.constants import SERVE_SESSION_ID

from .conftest import DATA, REPO, read_lines


@pytest.fixture()
def client(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=60) as c:
        yield c


def test_translate_returns_translations_scores_and_usage(client: httpx.Client) -> None:
    r = client.post(
        "/v1/translate",
        json={"texts": ["A dog is running in the snow.", ""], "source": "en", "target": "de", "beam_size": 4},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "en-de"
    assert "Hund" in body["translations"][0]["text"] and body["translations"][0]["score"] < 0
    assert body["translations"][1]["text"] == "" and body["translations"][0]["hypotheses"] is None
    assert body["usage"]["source_tokens"] > 5 and body["usage"]["target_tokens"] > 5


def test_n_best_hypotheses_and_routing_by_pair(client: httpx.Client) -> None:
    r = client.post(
        "/v1/translate",
        json={
            "texts": ["A man is riding a bike."],
            "source": "en",
            "target": "fr",
            "beam_size": 5,
            "num_hypotheses": 3,
        },
    )
    assert r.status_code == 200, r.text
    t = r.json()["translations"][0]
    assert r.json()["model"] == "en-fr" and "homme" in t["text"]
    assert len(t["hypotheses"]) == 3 and t["hypotheses"][0] == t["text"]
    assert t["scores"] == sorted(t["scores"], reverse=True)


def test_service_equals_the_library(client: httpx.Client) -> None:
    from model import Translator

    texts = read_lines("test_2016_flickr.en.gz", 8)
    expected = [r.hypotheses[0] for r in Translator.load("en-de", "cpu").translate(texts, beam_size=4)]
    r = client.post("/v1/translate", json={"texts": texts, "source": "en", "target": "de"})
    assert [t["text"] for t in r.json()["translations"]] == expected


def test_no_repeat_ngram_size_reaches_the_search(client: httpx.Client) -> None:
    from model import Translator

    texts = ["dog " * 30, "A dog is running in the snow."]  # the first makes the model stutter
    tr = Translator.load("en-de", "cpu")
    expected = [r.hypotheses[0] for r in tr.translate(texts, beam_size=4, no_repeat_ngram_size=2)]
    stutter = tr.translate(texts[:1], beam_size=4)[0].hypotheses[0]
    r = client.post("/v1/translate", json={"texts": texts, "source": "en", "target": "de", "no_repeat_ngram_size": 2})
    assert r.status_code == 200, r.text
    assert [t["text"] for t in r.json()["translations"]] == expected
    assert expected[0] != stutter and "Hund Hund" in stutter


def test_min_decoding_length_and_early_stopping_reach_the_search(client: httpx.Client) -> None:
    from model import Translator

    texts = ["A dog.", "A man is sleeping."]
    results = Translator.load("en-de", "cpu").translate(texts, beam_size=4, min_decoding_length=8, early_stopping=True)
    r = client.post(
        "/v1/translate",
        json={"texts": texts, "source": "en", "target": "de", "min_decoding_length": 8, "early_stopping": True},
    )
    assert r.status_code == 200, r.text
    assert [t["text"] for t in r.json()["translations"]] == [x.hypotheses[0] for x in results]
    assert all(len(x.token_ids[0]) >= 8 for x in results)


def test_each_translation_has_its_confidence_the_least_of_its_sentences(client: httpx.Client) -> None:
    from model.decode.confidence import confidence

    first, second = "A dog runs in the snow.", "Two men are playing soccer on a green field."
    alone = [
        client.post("/v1/translate", json={"texts": [t], "source": "en", "target": "de", "cache": False}).json()
        for t in (first, second)
    ]
    sure = [a["translations"][0]["confidence"] for a in alone]
    assert all(0 < c <= 1 for c in sure)
    # One sentence: the geometric mean of its tokens' probabilities, from its score and length.
    tokens = alone[0]["usage"]["target_tokens"]
    assert sure[0] == pytest.approx(confidence(alone[0]["translations"][0]["score"], tokens, 1.0), abs=1e-4)
    both = client.post("/v1/translate", json={"texts": [f"{first} {second}"], "source": "en", "target": "de"}).json()
    assert both["translations"][0]["confidence"] == min(sure)  # the sentence to check decides
    again = client.post("/v1/translate", json={"texts": [f"{first} {second}"], "source": "en", "target": "de"})
    assert again.json()["translations"][0]["confidence"] == min(sure)  # from the cache, the same
    html = {"texts": [f"<p>{first}</p>"], "source": "en", "target": "de", "tag_handling": "html"}
    assert client.post("/v1/translate", json=html).json()["translations"][0]["confidence"] == sure[0]
    echoed = client.post("/v1/translate", json={"texts": ["Ein Hund läuft durch den Schnee."], "target": "de"})
    assert echoed.json()["translations"][0]["confidence"] is None  # answered as sent: no model's
    # The compatible APIs answer it too, as a field their clients ignore.
    libre = client.post("/translate", json={"q": first, "source": "en", "target": "de"}).json()
    deepl = client.post("/v2/translate", json={"text": [first], "source_lang": "EN", "target_lang": "DE"}).json()
    assert libre["confidence"] == deepl["translations"][0]["confidence"] == sure[0]


def test_models_health_readiness_and_docs(client: httpx.Client) -> None:
    models = client.get("/v1/models").json()["models"]
    assert {m["name"] for m in models} == {"en-de", "en-fr"} and all(m["ready"] for m in models)
    assert all(m["compute_type"] == "float32" for m in models)  # the CPU's default
    from model.kernels import native  # the replicas run the build this process loads (one machine, one install)

    assert all(m["kernels"] == native.in_use() for m in models)
    # Each model's execution plan, as its load decided it: the C step and each GEMM shape's kernel by row count.
    plan = {m["name"]: m["plan"] for m in models}
    for pair in ("en-de", "en-fr"):
        assert plan[pair]["device"] == "cpu" and plan[pair]["compute_type"] == "float32"
        assert plan[pair]["step"] == ("c (one call)" if native.layer_norms_exactly() else "c (sublayers)")
        roles = {g["role"]: g for g in plan[pair]["gemms"]}
        assert roles["output projection"]["shape"] == [8000, 256] and "oneDNN" in roles["output projection"]["kernel"]
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    assert client.get("/docs").status_code == 200
    assert "/v1/translate" in client.get("/openapi.json").json()["paths"]
    # A path with a slash more is an unknown path, not a redirect built from the client's Host header.
    odd = client.get("/ui/app.js%2f", headers={"Host": "evil.example"})
    assert odd.status_code == 404 and "location" not in odd.headers and odd.json()["error"] == "not_found"
    assert client.get("/healthz/").status_code == 404


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"texts": [], "source": "en", "target": "de"}, 422, "texts"),
        ({"source": "en", "target": "de"}, 422, "texts"),
        ({"texts": "A dog.", "source": "en", "target": "de"}, 422, "texts"),
        ({"texts": ["A dog."], "source": "en", "target": "xx"}, 400, "en-de, en-fr"),
        ({"texts": ["A dog."] * 65, "source": "en", "target": "de"}, 422, "at most 64"),
        ({"texts": ["dog " * 600], "source": "en", "target": "de"}, 422, "at most 2000"),
        ({"texts": ["A dog."], "source": "en", "target": "de", "beam_size": 0}, 422, "beam_size"),
        ({"texts": ["A dog."], "source": "en", "target": "de", "beam_size": 99}, 422, "beam_size"),
        (
            {"texts": ["A dog."], "source": "en", "target": "de", "beam_size": 2, "num_hypotheses": 3},
            422,
            "num_hypotheses",
        ),
        ({"texts": ["A dog."], "source": "en", "target": "de", "unknown": 1}, 422, "unknown"),
        ({"texts": ["A dog."], "source": "en", "target": "de", "beam_size": True}, 422, "valid integer"),
        ({"texts": ["A dog."], "source": "en", "target": "de", "beam_size": "4"}, 422, "valid integer"),
        (
            {"texts": ["A dog."], "source": "en", "target": "de", "no_repeat_ngram_size": -1},
            422,
            "no_repeat_ngram_size",
        ),
        (
            {"texts": ["A dog."], "source": "en", "target": "de", "min_decoding_length": 20, "max_decoding_length": 20},
            422,
            "min_decoding_length must be below max_decoding_length (20)",
        ),
        ({"texts": ["A dog."], "source": "en", "target": "de", "early_stopping": "yes"}, 422, "valid boolean"),
        # Numbers are numbers on every field: floats as strictly as integers.
        ({"texts": ["A dog."], "source": "en", "target": "de", "length_penalty": True}, 422, "length_penalty"),
        ({"texts": ["A dog."], "source": "en", "target": "de", "timeout_s": "4"}, 422, "timeout_s"),
        ({"texts": ["A dog."], "source": "en", "target": "de", "ignore_tags": ["x"]}, 422, "tag_handling"),
    ],
)
def test_bad_requests_get_clear_4xx(client: httpx.Client, body: dict[str, object], status: int, needle: str) -> None:
    r = client.post("/v1/translate", json=body)
    assert r.status_code == status, r.text
    assert needle in r.text


def test_a_422_names_the_field_and_the_value_as_sent(client: httpx.Client) -> None:
    body = {"texts": ["A dog."], "source": "en", "target": "de", "timeout_s": "4", "beam_size": 2.5}
    r = client.post("/v1/translate", json=body)
    assert r.status_code == 422
    assert sorted(r.json()["detail"], key=str) == sorted(
        [
            {"loc": ["body", "timeout_s"], "msg": "Input should be a valid number", "input": "4"},
            {"loc": ["body", "beam_size"], "msg": "Input should be a valid integer", "input": 2.5},
        ],
        key=str,
    ), r.text
    nan = b'{"texts": ["A dog."], "target": "de", "length_penalty": NaN}'
    r = client.post("/v1/translate", content=nan, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"][0]["input"] == "nan", r.text


def test_source_over_the_model_limit_is_a_4xx(client: httpx.Client) -> None:
    text = "x " * 600  # under the character limit, over 512 tokens
    r = client.post("/v1/translate", json={"texts": [text], "source": "en", "target": "de"})
    assert r.status_code == 422 and "at most 512" in r.text


def test_invalid_json_invalid_utf8_and_oversized_bodies(client: httpx.Client) -> None:
    headers = {"content-type": "application/json"}
    r = client.post("/v1/translate", content=b'{"texts": [', headers=headers)
    assert r.status_code == 400 and r.json()["error"] == "invalid_json", r.text
    nan = b'{"texts": ["A dog."], "source": "en", "target": "de", "length_penalty": NaN}'  # Python's json reads NaN
    r = client.post("/v1/translate", content=nan, headers=headers)
    assert r.status_code == 422 and "finite" in r.text, r.text
    bad_utf8 = b'{"texts": ["\xff\xfe"], "source": "en", "target": "de"}'
    r = client.post("/v1/translate", content=bad_utf8, headers=headers)
    assert 400 <= r.status_code < 500, r.text
    big = json.dumps({"texts": ["a" * 1000] * 1200, "source": "en", "target": "de"}).encode()
    r = client.post("/v1/translate", content=big, headers=headers)
    assert r.status_code == 413 and "bytes" in r.text
    # The server's max_body_bytes (900,000 here, set in its Settings) is the limit, not the default.
    r = client.post("/v1/translate", content=b" " * 950_000 + b"{}", headers=headers)
    assert r.status_code == 413 and "over 900000 bytes" in r.text, r.text


def test_a_request_at_the_front_s_url_and_header_limits_reaches_the_gateway_and_one_past_them_does_not(
    client: httpx.Client,
) -> None:
    from service.api import front

    path = "/v1/models?q=" + "a" * (front.MAX_URL_BYTES - len("/v1/models?q="))
    cookie = {"cookie": "c=" + "b" * (front.MAX_HEADER_BYTES - 1000)}
    r = client.get(path, headers=cookie)  # the gateway's own HTTP server takes what the front lets through
    assert r.status_code == 200 and r.json()["models"], r.text
    r = client.get(path + "a", headers=cookie)
    assert r.status_code == 414 and r.json()["error"] == "uri_too_long"
    r = client.get("/v1/models", headers={"cookie": "c=" + "b" * front.MAX_HEADER_BYTES})
    assert r.status_code == 431 and r.json()["error"] == "headers_too_large"


def test_every_answer_carries_a_request_id_and_every_error_body_repeats_it(client: httpx.Client) -> None:
    mine = {"X-Request-ID": "client-42"}
    r = client.post("/v1/translate", json={"texts": ["A dog."], "source": "en", "target": "xx"}, headers=mine)
    assert r.status_code == 400 and r.headers["x-request-id"] == "client-42"
    assert r.json() == {"error": "unsupported_pair", "detail": r.json()["detail"], "request_id": "client-42"}
    r = client.post("/v1/translate", json={"texts": [], "source": "en", "target": "de"})  # no id: one is made
    assert r.status_code == 422 and len(r.json()["request_id"]) >= 16
    assert r.headers["x-request-id"] == r.json()["request_id"]
    ok = client.post("/v1/translate", json={"texts": ["A dog."], "source": "en", "target": "de"})
    assert ok.status_code == 200 and ok.headers["x-request-id"] not in ("", r.json()["request_id"])
    big = json.dumps({"texts": ["a" * 1000] * 1200, "source": "en", "target": "de"}).encode()
    r = client.post("/v1/translate", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["request_id"] == r.headers["x-request-id"]


def test_every_answer_says_its_queue_wait_decoding_and_total_in_server_timing(client: httpx.Client) -> None:
    def timing(r: httpx.Response) -> dict[str, float]:
        parts = [p.strip().split(";dur=") for p in r.headers["server-timing"].split(",")]
        return {name: float(ms) for name, ms in parts}

    text = "A girl in a red coat reads a map beside a fountain."
    fresh = client.post("/v1/translate", json={"texts": [text], "source": "en", "target": "de", "cache": False})
    assert fresh.status_code == 200
    t = timing(fresh)
    assert set(t) == {"queue", "decode", "total"} and t["queue"] >= 0
    assert 0 < t["decode"] <= t["total"]  # the model decoded it, inside the gateway's time
    for _ in range(2):  # the first fills the cache
        cached = client.post("/v1/translate", json={"texts": [text], "source": "en", "target": "de"})
    assert timing(cached)["decode"] == 0 < timing(cached)["total"]  # from the cache: nothing decoded
    refused = client.post("/v1/translate", json={"texts": [text], "source": "en", "target": "xx"})
    assert refused.status_code == 400 and timing(refused)["decode"] == 0


def test_a_paragraph_is_translated_sentence_by_sentence_unless_asked_not_to(client: httpx.Client) -> None:
    def post(texts: list[str], **options: object) -> list[dict[str, object]]:
        r = client.post("/v1/translate", json={"texts": texts, "source": "en", "target": "de", **options})
        assert r.status_code == 200, r.text
        return list(r.json()["translations"])

    first, second = "A dog is running in the snow.", "Two men are sitting on a bench."
    alone = post([first, second], num_hypotheses=2, beam_size=4)
    joined = post([f"{first}  {second}", first], num_hypotheses=2, beam_size=4)
    assert joined[0]["text"] == f"{alone[0]['text']}  {alone[1]['text']}"  # the separator kept
    assert joined[0]["score"] == pytest.approx((alone[0]["score"] + alone[1]["score"]) / 2, abs=1e-5)  # batch rounding
    assert joined[0]["hypotheses"][1] == f"{alone[0]['hypotheses'][1]}  {alone[1]['hypotheses'][1]}"
    assert joined[1]["hypotheses"] == alone[0]["hypotheses"]  # a one-sentence text is untouched
    assert joined[1]["scores"] == pytest.approx(alone[0]["scores"], abs=1e-5)
    whole = post([f"{first}  {second}"], split_sentences=False)[0]["text"]
    from model import Translator

    assert whole == Translator.load("en-de", "cpu").translate([f"{first}  {second}"])[0].hypotheses[0]  # sent whole


@pytest.mark.parametrize(
    ("header", "path", "shape"),
    [
        ("X-Request-ID", "/healthz", "error"),
        (SERVE_SESSION_ID, "/v1/translate", "error"),  # Serve's affinity header
        ("serve_multiplexed_model_id", "/translate", "code"),  # LibreTranslate's shape on its route
        ("X-Request-Timeout-Seconds", "/v2/translate", "code"),
    ],
)
def test_a_header_that_is_not_utf8_is_a_json_400_naming_it(server: str, header: str, path: str, shape: str) -> None:
    # Serve decodes these headers itself; the front refuses what it could not decode (service/api/front.py).
    port = int(server.rsplit(":", 1)[1])
    body = (
        b'{"texts": ["A dog."], "q": "A dog.", "text": ["A dog."], "source": "en", "target": "de", "target_lang": "DE"}'
    )
    method = b"GET" if path == "/healthz" else b"POST"
    raw = (
        method + f" {path} HTTP/1.1\r\nHost: x\r\n{header}: caf".encode() + b"\xe9\r\n"
        b"Content-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\nConnection: close\r\n\r\n"
    ) + body
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(raw)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), answer[:300]
    error = json.loads(payload)
    assert error[shape] == "invalid_header" and header.lower() in json.dumps(error) and error["request_id"]
    assert f"x-request-id: {error['request_id']}".encode() in head.lower()


def test_a_lone_surrogate_is_a_4xx_naming_the_text(client: httpx.Client) -> None:
    # Valid JSON ("\\ud800" is a legal escape) that decodes to a str no UTF-8 tokenizer can take.
    body = b'{"texts": ["A dog.", "A \\ud800 dog."], "source": "en", "target": "de"}'
    r = client.post("/v1/translate", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"] == "invalid_text", r.text
    assert "texts[1]" in r.json()["detail"] and "surrogate" in r.json()["detail"]
    r = client.post(
        "/translate",
        content=b'{"q": "\\udfff", "source": "en", "target": "de"}',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and "surrogate" in r.text, r.text  # LibreTranslate's route: no 422
    # In any other field: a 422 naming it, the value written back as it was sent.
    for field in ("source", "target", "tag_handling"):
        body = {"texts": ["A dog."], "source": "en", "target": "de", field: "x\ud800"}
        r = client.post("/v1/translate", content=json.dumps(body), headers={"content-type": "application/json"})
        assert r.status_code == 422 and r.json()["error"] == "invalid_request", r.text
        assert r.json()["detail"][0]["loc"] == ["body", field] and r.json()["detail"][0]["input"] == "x\ud800"


def test_libretranslate_json_form_lists_and_alternatives(client: httpx.Client) -> None:
    r = client.post("/translate", json={"q": "A dog.", "source": "en", "target": "de"})
    assert r.status_code == 200 and "Hund" in r.json()["translatedText"]
    r = client.post("/translate", data={"q": "A cat.", "source": "en", "target": "fr", "format": "text"})
    assert r.status_code == 200 and "chat" in r.json()["translatedText"]
    r = client.post("/translate", json={"q": ["A dog.", "A man."], "source": "en", "target": "de", "alternatives": 2})
    body = r.json()
    assert len(body["translatedText"]) == 2 and len(body["alternatives"]) == 2 and len(body["alternatives"][0]) == 2
    r = client.post("/translate", json={"q": "A dog.", "source": "auto", "target": "de"})
    assert r.status_code == 200 and r.json()["detectedLanguage"]["language"] == "en", r.text
    r = client.post("/translate", json={"q": "A dog.", "source": "en", "target": "zz"})
    assert r.status_code == 400 and "served pairs" in r.text
    langs = client.get("/languages").json()
    assert {"code": "en", "name": "English", "targets": ["de", "fr"]} in langs


def test_libretranslate_html_translates_sentences_whole_and_carries_inline_markup_over(client: httpx.Client) -> None:
    sentence = "A man in a red shirt is riding a bike."
    plain = client.post("/v1/translate", json={"texts": [sentence, "Two men"], "source": "en", "target": "de"}).json()[
        "translations"
    ]
    fragment = (
        '<p class="x">A man in a <b>red shirt</b> is riding a <a href="y">bike</a>.</p>'
        "<script>if (a < b) {}</script> <i>Two men</i>"
    )
    r = client.post(
        "/translate",
        json={"q": [fragment, "<hr>"], "source": "en", "target": "de", "format": "html", "alternatives": 1},
    )
    assert r.status_code == 200, r.text
    (out, markup_only), alternatives = r.json()["translatedText"], r.json()["alternatives"]
    paragraph = out[out.index("<p") : out.index("</p>") + 4]
    # The sentence reached the model whole: without its markup it is the plain translation ...
    assert re.sub(r"<[^>]+>", "", paragraph) == plain[0]["text"] == "Ein Mann in einem roten Hemd fährt Fahrrad."
    # ... and each element wraps the words aligned to its own.
    assert paragraph == '<p class="x">Ein Mann in <b>einem roten Hemd</b> fährt <a href="y">Fahrrad</a>.</p>'
    assert out.endswith(f"</p><script>if (a < b) {{}}</script> <i>{html.escape(plain[1]['text'], quote=False)}</i>")
    assert markup_only == "<hr>" and alternatives[1] == ["<hr>"]
    assert alternatives[0][0].count("<b>") == 1 and alternatives[0][0].count('<a href="y">') == 1
    r = client.post("/translate", json={"q": "<br/>", "source": "EN", "target": "De", "format": "html"})
    assert r.status_code == 200 and r.json()["translatedText"] == "<br/>"  # language codes in any case


def test_libretranslate_html_of_many_runs_equals_the_library_s_alignment(client: httpx.Client) -> None:
    from model import Translator
    from service.text.html_text import HtmlDocument

    captions = [c for c in read_lines("test_2016_flickr.en.gz", 40) if len(c.split()) > 3][:20]
    items = []
    for caption in captions:  # the second word of each in <b>: 20 runs to align, more than one engine turn's
        first, second, rest = caption.split(" ", 2)
        items.append(f"<li>{html.escape(first)} <b>{html.escape(second)}</b> {html.escape(rest)}</li>")
    fragment = "<ul>" + "".join(items) + "</ul>"
    r = client.post("/translate", json={"q": fragment, "source": "en", "target": "de", "format": "html"})
    assert r.status_code == 200, r.text
    tr = Translator.load("en-de", "cpu")
    doc = HtmlDocument(fragment)
    assert doc.texts == captions  # one sentence a run
    translations = [x.hypotheses[0] for x in tr.translate(captions)]
    aligned = tr.align(list(zip(captions, translations, strict=True)))
    links = [[(*k.target, *k.source) for k in pair] for pair in aligned]
    assert r.json()["translatedText"] == doc.render(translations, links)
    assert r.json()["translatedText"].count("<b>") == 20


def test_v1_translate_takes_html_with_deepl_s_tag_handling(client: httpx.Client) -> None:
    fragment = "<p>A man in a <b>red shirt</b> is riding a bike. Two <i>dogs</i> play.</p><hr>"
    libre = client.post(
        "/translate", json={"q": fragment, "source": "en", "target": "de", "format": "html", "alternatives": 1}
    ).json()
    r = client.post(
        "/v1/translate",
        json={"texts": [fragment, "<br>"], "source": "en", "target": "de", "tag_handling": "html", "num_hypotheses": 2},
    )
    assert r.status_code == 200, r.text
    first, markup_only = r.json()["translations"]
    assert first["text"] == libre["translatedText"] and first["hypotheses"] == [first["text"], *libre["alternatives"]]
    assert "<b>" in first["text"] and "<i>" in first["text"] and first["text"].endswith("</p><hr>")
    assert first["scores"][0] == first["score"] < 0 and first["scores"] == sorted(first["scores"], reverse=True)
    assert markup_only["text"] == "<br>" and r.json()["usage"]["source_tokens"] > 10
    r = client.post(
        "/v1/translate", json={"texts": ["<b>A</b>"], "source": "en", "target": "de", "tag_handling": "xml"}
    )
    assert r.status_code == 422 and "tag_handling" in r.text


def test_libretranslatepy_client_works_unchanged(server: str) -> None:
    from libretranslatepy import LibreTranslateAPI

    lt = LibreTranslateAPI(server)
    assert "Hund" in lt.translate("A dog is sleeping.", "en", "de")
    assert any(lang["code"] == "fr" for lang in lt.languages())


def test_concurrent_requests_share_batches_and_match_sequential(server: str, client: httpx.Client) -> None:
    texts = read_lines("test_2016_flickr.en.gz", 64)
    sequential = [
        client.post("/v1/translate", json={"texts": [t], "source": "en", "target": "de", "cache": False}).json()[
            "translations"
        ][0]["text"]
        for t in texts
    ]
    before = client.get("/v1/stats").json()["en-de"]

    async def fire() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server, timeout=60) as ac:
            return await asyncio.gather(
                *(
                    ac.post("/v1/translate", json={"texts": [t], "source": "en", "target": "de", "cache": False})
                    for t in texts
                )
            )

    responses = asyncio.run(fire())
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200]
    concurrent = [r.json()["translations"][0]["text"] for r in responses]
    assert concurrent == sequential
    after = client.get("/v1/stats").json()["en-de"]
    batches = after["batches"] - before["batches"]
    assert after["batched_sentences"] - before["batched_sentences"] == 64
    assert batches < 64 / 2, f"64 concurrent requests ran in {batches} batches: no dynamic batching"
    assert after["max_batch_sentences"] > 1
    assert after["engine_cpu_s"] > before["engine_cpu_s"]  # the engine thread's CPU, as benchmarks read it


def test_client_that_disconnects_mid_decode_frees_its_slots(server: str, client: httpx.Client) -> None:
    from model import Translator

    lines = read_lines("test_2016_flickr.en.gz", 72)
    texts = [" ".join(lines[i : i + 3]) for i in range(0, 72, 3)]  # 24 long sources: dozens of steps each
    alone = Translator.load("en-de", "cpu").translate(texts, beam_size=8)
    steps_needed = [len(r.token_ids[0]) + 1 for r in alone]  # decoder steps each sentence needs in continuous mode
    before = client.get("/v1/stats").json()["en-de"]
    with pytest.raises(httpx.TimeoutException):  # gone after a few decoder steps
        client.post(
            "/v1/translate",
            json={"texts": texts, "source": "en", "target": "de", "beam_size": 8, "split_sentences": False},
            timeout=0.3,
        )  # each text whole, as `alone`
    for _ in range(100):
        after = client.get("/v1/stats").json()["en-de"]
        if after["active"] == 0 and after["cancelled"] > before["cancelled"]:
            break
        time.sleep(0.05)
    steps = after["steps"] - before["steps"]
    cancelled = after["cancelled"] - before["cancelled"]
    assert after["active"] == 0
    assert 0 < steps < max(steps_needed)  # started, then stopped well before the end
    # Every sentence that needed more steps than ran was withdrawn (a fast machine may finish short ones).
    assert sum(n > steps for n in steps_needed) <= cancelled <= 24


def test_locustfile_runs_against_the_service_with_zero_failures(server: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "locust",
            "-f",
            str(REPO / "loadtests" / "locustfile.py"),
            "--headless",
            "-u",
            "3",
            "-r",
            "3",
            "-t",
            "6s",
            "--host",
            server,
            "--csv",
            str(tmp_path / "smoke"),
            "--only-summary",
        ],
        cwd=REPO,
        env={**os.environ, "BEAMSERVE_DATA": str(DATA)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    with open(tmp_path / "smoke_stats.csv", newline="") as f:
        total = next(r for r in csv.DictReader(f) if r["Name"] == "Aggregated")
    assert int(total["Request Count"]) >= 5, proc.stderr[-2000:]
    assert int(total["Failure Count"]) == 0, proc.stderr[-2000:]
    assert proc.returncode == 0


@pytest.mark.parametrize("value", ["Infinity", "1e999", "-Infinity", "NaN", "2.5", "true", '"two"', "[]", '"\u0663"'])
def test_libretranslate_alternatives_that_are_not_integers_are_a_400(client: httpx.Client, value: str) -> None:
    body = '{"q": "A dog.", "source": "en", "target": "de", "alternatives": ' + value + "}"
    r = client.post("/translate", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "alternatives" in r.json()["error"], r.text  # LibreTranslate's shape


def test_libretranslate_languages_that_are_not_strings_are_named_as_sent(client: httpx.Client) -> None:
    r = client.post("/translate", json={"q": "A dog.", "source": None, "target": "de"})
    assert r.status_code == 400 and r.json()["error"] == "source must be a language code or 'auto', not null", r.text
    r = client.post("/translate", json={"q": "A dog.", "source": "en", "target": 7})
    assert r.status_code == 400 and r.json()["error"] == "target must be a language code, not 7", r.text
    r = client.post("/translate", data={"q": "A dog.", "source": "en", "target": "de", "alternatives": "1"})
    assert r.status_code == 200 and len(r.json()["alternatives"]) == 1  # a form's digits are an integer


def test_head_compressed_and_chunked_bodies_get_their_own_statuses(client: httpx.Client) -> None:
    for path in ("/healthz", "/v1/models", "/languages"):
        got, head = client.get(path), client.head(path)
        assert head.status_code == 200 and head.content == b"", path
        assert head.headers["content-length"] == got.headers["content-length"], path
    assert client.head("/v1/translate").status_code == 405  # a POST route
    body = json.dumps({"texts": ["A dog."], "source": "en", "target": "de"}).encode()
    r = client.post("/v1/translate", content=gzip.compress(body), headers={"content-encoding": "gzip"})
    assert r.status_code == 415 and r.json()["error"] == "unsupported_media_type" and "gzip" in r.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the body is counted as it arrives
        yield b'{"texts": ["'
        for _ in range(100):
            yield b"a" * 10_000
        yield b'"], "source": "en", "target": "de"}'

    r = client.post("/v1/translate", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"] == "body_too_large", r.text


@pytest.mark.parametrize("route", ["/translate", "/v1/translate"])
def test_json_nested_too_deep_is_a_4xx_not_a_500(client: httpx.Client, route: str) -> None:
    body = "[" * 100_000 + "]" * 100_000
    r = client.post(route, content=body, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, r.text
    body = r.json()  # LibreTranslate's route: the message in "error", the code beside it
    assert body["request_id"] and body.get("code", body["error"]) in ("invalid_json", "invalid_request")


def test_html_past_the_nesting_and_element_limits_is_a_fast_4xx(client: httpx.Client) -> None:
    from service.text.html_text import MAX_DEPTH, MAX_ELEMENTS

    deep = "<b>" * 70_000 + "A dog." + "</b>" * 70_000  # 490 KB, under the body limit
    start = time.monotonic()
    r = client.post("/translate", json={"q": deep, "source": "en", "target": "de", "format": "html"})
    assert r.status_code == 400 and r.json()["code"] == "html_too_complex" and str(MAX_DEPTH) in r.text
    assert time.monotonic() - start < 5  # refused while parsing, not after
    many = "<i>x</i> " * (MAX_ELEMENTS // 2 + 1)
    r = client.post("/translate", json={"q": many, "source": "en", "target": "de", "format": "html"})
    assert r.status_code == 400 and str(MAX_ELEMENTS) in r.text  # LibreTranslate's route: a 422 is a 400


def test_html_that_ends_inside_markup_is_a_422_saying_where(client: httpx.Client) -> None:
    body = {"texts": ["A dog runs. <b"], "source": "en", "target": "de", "tag_handling": "html"}
    r = client.post("/v1/translate", json=body)
    assert r.status_code == 422 and r.json()["error"] == "html_malformed" and "at character 12" in r.text
    r = client.post(
        "/translate", json={"q": "A man <script> rides a bike.", "source": "en", "target": "de", "format": "html"}
    )
    assert r.status_code == 200 and r.json()["translatedText"].endswith("<script> rides a bike.")
    assert client.get("/healthz").status_code == 200


def test_stats_report_allocator_memory_and_the_gateways_admission(client: httpx.Client) -> None:
    from service.engine.allocator import jemalloc_path

    stats = client.get("/v1/stats").json()["en-de"]
    # The replica process runs with jemalloc preloaded exactly when the host has it (allocator "auto").
    assert stats["allocator"] == ("jemalloc" if jemalloc_path() else "system")
    assert stats["resident_bytes"] > 100 * 2**20
    # The engine decodes in a process of its own (Settings.engine_process), whose memory that is.
    with open(f"/proc/{stats['engine_process']}/cmdline", "rb") as f:
        assert b"service.engine.engine_host" in f.read()
    assert {"in_flight_work", "refused", "cache_hits", "cache_misses", "cache"} <= set(stats["gateway"])


def test_cached_answers_equal_fresh_ones_and_are_counted(client: httpx.Client) -> None:
    texts = ["A dog runs in the park. Two children watch it.", "A man rides a red bicycle.", "A dog runs in the park."]
    body = {"texts": texts, "source": "en", "target": "de", "beam_size": 3, "num_hypotheses": 2}

    def gateway() -> dict[str, int]:
        return client.get("/v1/stats").json()["en-de"]["gateway"]

    fresh = client.post("/v1/translate", json={**body, "cache": False})
    before = gateway()
    first = client.post("/v1/translate", json=body)  # 3 distinct sentences: looked up, decoded, kept
    middle = gateway()
    again = client.post("/v1/translate", json=body)  # all three from the cache
    after = gateway()
    assert fresh.status_code == first.status_code == again.status_code == 200
    assert fresh.json() == first.json() == again.json()  # texts, scores, n-best lists and usage alike
    assert middle["cache_misses"] - before["cache_misses"] == 3
    assert (after["cache_hits"] - middle["cache_hits"], after["cache_misses"] - middle["cache_misses"]) == (3, 0)
    # Other options are another answer: not served from the cache.
    other = client.post("/v1/translate", json={**body, "beam_size": 2, "num_hypotheses": 1})
    assert other.status_code == 200 and gateway()["cache_misses"] - after["cache_misses"] == 3
    # cache: false neither reads nor counts.
    client.post("/v1/translate", json={**body, "cache": False})
    assert gateway()["cache_hits"] == gateway()["cache_hits"] == after["cache_hits"]


def test_urls_addresses_and_placeholders_come_back_exactly_as_sent(client: httpx.Client) -> None:
    texts = [
        "A man visits https://example.com/shop?item=42&x=1 with his dog. He writes to bob.smith@example.org.",
        "Hello {name}, you have {{count}} new pictures of %s at $place.",
        "A dog runs in the park.",  # nothing to protect: the same translation as on its own
    ]
    r = client.post("/v1/translate", json={"texts": texts, "source": "en", "target": "de"})
    assert r.status_code == 200, r.text
    out = [t["text"] for t in r.json()["translations"]]
    for kept in ("https://example.com/shop?item=42&x=1", "bob.smith@example.org"):
        assert kept in out[0], out[0]
    for kept in ("{name}", "{{count}}", "%s", "$place"):
        assert kept in out[1], out[1]
    assert "<" not in "".join(out) and "&amp;" not in out[0]  # plain text back, not the HTML it went through
    alone = client.post("/v1/translate", json={"texts": texts[2:], "source": "en", "target": "de"}).json()
    assert out[2] == alone["translations"][0]["text"]
    libre = client.post("/translate", json={"q": texts[1], "source": "en", "target": "de"}).json()
    assert libre["translatedText"] == out[1]


def test_html_not_to_translate_is_kept_verbatim_in_place(client: httpx.Client) -> None:
    html = (
        '<p>A man in a <span translate="no">Acme Cloud</span> shirt rides a bike.</p>'
        '<div class="notranslate"><p>Two dogs play.</p></div><p>A woman <x>Big Dog</x> sings.</p>'
    )
    body = {"texts": [html], "source": "en", "target": "de", "tag_handling": "html", "ignore_tags": ["x"]}
    r = client.post("/v1/translate", json=body)
    assert r.status_code == 200, r.text
    out = r.json()["translations"][0]["text"]
    assert '<span translate="no">Acme Cloud</span>' in out and out.startswith("<p>") and "Mann" in out
    assert '<div class="notranslate"><p>Two dogs play.</p></div>' in out
    assert "<x>Big Dog</x>" in out and "Frau" in out


def test_mastodon_s_request_and_libretranslate_s_error_shape(client: httpx.Client) -> None:
    # The body Mastodon's LibreTranslate service sends for a post with a language (HTML, q a list, api_key).
    body = {
        "q": ["<p>A dog runs in the <b>park</b>.</p>"],
        "source": "en",
        "target": "de",
        "format": "html",
        "api_key": "",
    }
    r = client.post("/translate", json=body, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    [text] = r.json()["translatedText"]
    assert text.startswith("<p>") and "<b>" in text and "Hund" in text
    # Errors as LibreTranslate's clients show them: {"error": "<message>"}.
    r = client.post("/translate", json={**body, "target": "zz"})
    assert r.status_code == 400 and isinstance(r.json()["error"], str) and "served pairs" in r.json()["error"]
    big = b'{"q": "' + b"a" * 1_100_000 + b'", "source": "en", "target": "de"}'
    r = client.post("/translate", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "bytes" in r.json()["error"]
