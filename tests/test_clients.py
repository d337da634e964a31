"""The clients people already run, against the real server on 127.0.0.1: language detection on every
route, LibreTranslate's /detect and /frontend/settings, DeepL's API through the official `deepl` package."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from .conftest import read_lines

pytestmark = pytest.mark.slow

ENGLISH = ["A dog is running in the snow.", "Two men are playing soccer on a field."]
GERMAN = "Ein Mann schläft in einem grünen Raum auf einem Sofa."


@pytest.fixture()
def client(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=60) as c:
        yield c


def test_a_mixed_language_batch_is_detected_per_text(client: httpx.Client) -> None:
    texts = [ENGLISH[0], GERMAN, "42", ENGLISH[1]]
    r = client.post("/v1/translate", json={"texts": texts, "target": "de"})
    assert r.status_code == 200, r.text
    body = r.json()
    english = [ENGLISH[0], "42", ENGLISH[1]]
    named = client.post("/v1/translate", json={"texts": english, "source": "en", "target": "de"}).json()
    out = body["translations"]
    # English translated exactly as when the source is named ("42", no evidence, goes with the majority);
    # German, already the target language, answered as it came.
    assert [out[0]["text"], out[2]["text"], out[3]["text"]] == [t["text"] for t in named["translations"]]
    assert out[1]["text"] == GERMAN and out[1]["score"] == 0.0
    assert [t["detected_source"]["language"] for t in out] == ["en", "de", "en", "en"]
    assert out[0]["detected_source"]["confidence"] > 0.5 and out[2]["detected_source"]["confidence"] == 0.0
    assert body["model"] == "en-de" and named["translations"][0].get("detected_source") is None
    assert body["usage"] == named["usage"]  # the German text cost no model tokens


def test_a_detected_language_with_no_model_to_the_target_is_named(client: httpx.Client) -> None:
    r = client.post("/v1/translate", json={"texts": [ENGLISH[0], GERMAN], "source": "auto", "target": "fr"})
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "unsupported_pair" and "texts[1] is in German (de)" in r.json()["detail"]


POLISH = "Dwa psy biegają po śniegu w parku niedaleko zamarzniętego jeziora."


def test_a_text_in_a_language_no_model_serves_is_named_on_every_route(client: httpx.Client) -> None:
    # Not taken for German (the target) and answered as it came, nor for English and translated.
    r = client.post("/v1/translate", json={"texts": [ENGLISH[0], POLISH], "target": "de"})
    assert r.status_code == 400 and r.json()["error"] == "unsupported_pair", r.text
    assert "texts[1] is in Polish (pl), detected; no model for pl -> de" in r.json()["detail"]
    r = client.post("/translate", json={"q": POLISH, "source": "auto", "target": "de"})
    assert r.status_code == 400 and "Polish (pl)" in r.json()["error"], r.text
    r = client.post("/v2/translate", json={"text": [POLISH], "target_lang": "DE"})
    assert r.status_code == 400 and "Polish (pl)" in r.json()["message"], r.text
    [[found]] = client.post("/detect", json={"q": [POLISH]}).json()
    assert found["language"] == "pl" and found["confidence"] > 90


def test_a_long_text_of_unsure_language_is_not_answered_as_already_in_the_target(client: httpx.Client) -> None:
    mixed = "Ein Mann und a woman sind in the park."  # German at 71% among en, de, fr
    r = client.post("/v1/translate", json={"texts": [mixed], "target": "de"})
    assert r.status_code == 400 and r.json()["error"] == "ambiguous_source", r.text
    assert "name its source language" in r.json()["detail"]
    named = client.post("/v1/translate", json={"texts": [mixed], "source": "en", "target": "de"})
    assert named.status_code == 200
    # A short text the same: "Hotel" is German at 76% among en, de, fr; sent to German it is not echoed.
    r = client.post("/translate", json={"q": "Hotel", "source": "auto", "target": "de"})
    assert r.status_code == 400 and "may be in German (de, detected at 76%)" in r.json()["error"], r.text


def test_mastodon_s_request_without_a_language(client: httpx.Client) -> None:
    # What Mastodon sends for a post with no language tag: source auto, HTML, q a list, an empty api_key.
    body = {"q": ["<p>A dog runs in the <b>park</b>.</p>"], "source": "auto", "target": "de", "format": "html"}
    r = client.post("/translate", json=body | {"api_key": ""})
    assert r.status_code == 200, r.text
    [text] = r.json()["translatedText"]
    [found] = r.json()["detectedLanguage"]
    assert text.startswith("<p>") and "<b>" in text and "Hund" in text
    assert found["language"] == "en" and 50 < found["confidence"] <= 100


def test_libretranslate_detect_and_a_text_already_in_the_target(client: httpx.Client, server: str) -> None:
    from libretranslatepy import LibreTranslateAPI

    lt = LibreTranslateAPI(server)
    ranks = lt.detect(GERMAN)
    assert ranks[0]["language"] == "de" and ranks[0]["confidence"] > 90 and len(ranks) == 3
    r = client.post("/detect", json={"q": [GERMAN, ENGLISH[0]]})
    assert [ranks[0]["language"] for ranks in r.json()] == ["de", "en"]
    r = client.post("/translate", json={"q": GERMAN, "source": "auto", "target": "de"})
    found = {"confidence": pytest.approx(99, abs=1.1), "language": "de"}
    assert r.json() == {"translatedText": GERMAN, "detectedLanguage": found}
    r = client.post("/detect", json={"text": GERMAN})
    assert r.status_code == 400 and "q must be" in r.json()["error"]


def test_libretranslate_frontend_settings(client: httpx.Client) -> None:
    settings = client.get("/frontend/settings").json()
    assert settings["charLimit"] == 2000 and settings["keyRequired"] is False
    assert settings["filesTranslation"] is True and settings["supportedFilesFormat"] == [
        ".docx", ".epub", ".htm", ".html", ".odp", ".ods", ".odt", ".pptx", ".srt", ".txt", ".vtt", ".xlf", ".xliff",
        ".xlsx",
    ]  # fmt: skip
    assert settings["language"]["source"]["code"] == "auto" and settings["language"]["target"]["code"] == "de"


def test_detection_is_right_on_multi30k_sentences(client: httpx.Client) -> None:
    english = read_lines("test_2016_flickr.en.gz", 32)
    german = read_lines("val.de.gz", 32)
    r = client.post("/detect", json={"q": english + german})
    assert [ranks[0]["language"] for ranks in r.json()] == ["en"] * 32 + ["de"] * 32


def test_the_official_deepl_client(server: str) -> None:
    import deepl

    translator = deepl.Translator("any-key", server_url=server)
    one = translator.translate_text(ENGLISH[0], target_lang="DE")
    assert isinstance(one, deepl.TextResult)
    assert "Hund" in one.text and one.detected_source_lang == "EN" and one.billed_characters == len(ENGLISH[0])
    many = translator.translate_text(ENGLISH, source_lang="EN", target_lang="FR", split_sentences="nonewlines")
    assert isinstance(many, list) and len(many) == 2 and "hommes" in many[1].text
    html = translator.translate_text("<p>A <b>dog</b> runs.</p>", target_lang="DE", tag_handling="html")
    assert isinstance(html, deepl.TextResult) and html.text.startswith("<p>") and "<b>" in html.text
    assert [lang.code for lang in translator.get_source_languages()] == ["EN"]
    assert [lang.code for lang in translator.get_target_languages()] == ["DE", "FR"]
    # Options beamserve cannot honour are refused by name, in DeepL's error shape.
    with pytest.raises(deepl.DeepLException, match="formality is not supported"):
        translator.translate_text(ENGLISH[0], target_lang="DE", formality="more")
    with pytest.raises(deepl.DeepLException, match="context is not supported"):
        translator.translate_text(ENGLISH[0], target_lang="DE", context="A sports report.")
    with pytest.raises(deepl.DeepLException, match="xml is not supported"):
        translator.translate_text(ENGLISH[0], target_lang="DE", tag_handling="xml")
    # prefer_* falls back to the default register, as DeepL does for languages without formality.
    assert "Hund" in translator.translate_text(ENGLISH[0], target_lang="DE", formality="prefer_less").text


def test_deepl_form_body_and_error_shape(client: httpx.Client) -> None:
    r = client.post("/v2/translate", data={"text": ENGLISH, "target_lang": "de", "split_sentences": "0"})
    assert r.status_code == 200, r.text
    assert [t["detected_source_language"] for t in r.json()["translations"]] == ["EN", "EN"]
    r = client.post("/v2/translate", json={"text": [ENGLISH[0]], "target_lang": "ZZ"})
    assert r.status_code == 400 and "served pairs" in r.json()["message"]
    r = client.post("/v2/translate", json={"text": [ENGLISH[0]], "target_lang": "DE", "context": "sports"})
    assert r.status_code == 400 and r.json()["message"] == "context is not supported: send it as part of the text"
    r = client.post("/v2/translate", json={"text": [], "target_lang": "DE"})
    assert r.status_code == 400 and "text" in r.json()["message"]


def test_openapi_types_the_compatible_bodies(client: httpx.Client) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    libre = paths["/translate"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"q", "source", "target", "format", "alternatives", "api_key"} <= set(libre["properties"])
    deepl_body = paths["/v2/translate"]["post"]["requestBody"]["content"]["application/x-www-form-urlencoded"]
    assert {"text", "target_lang", "source_lang", "split_sentences"} <= set(deepl_body["schema"]["properties"])


def test_no_cors_headers_by_default(client: httpx.Client) -> None:
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    r = client.options("/v1/translate", headers=preflight)
    assert "access-control-allow-origin" not in r.headers
    assert (
        "access-control-allow-origin" not in client.get("/languages", headers={"Origin": "https://a.example"}).headers
    )
