"""Language tags as clients write them (BCP 47, ISO 639-3, DeepL's) -> the served codes
(service/text/language_tags.py), and through the API."""

from __future__ import annotations

import httpx
import pytest

from service.errors import ApiError
from service.text.language_tags import served_code

SERVED = {"en", "de", "fr", "zh", "zt", "sr", "pt"}


@pytest.mark.parametrize(
    ("tag", "code"),
    [
        ("pt-BR", "pt"), ("PT-PT", "pt"), ("en-GB", "en"), ("EN-US", "en"), ("de-CH", "de"), ("deu", "de"),
        ("zh", "zh"), ("zh-Hans", "zh"), ("zh-CN", "zh"), ("zh-Hant", "zt"), ("ZH-HANT", "zt"), ("zh-TW", "zt"),
        ("zh_HK", "zt"), ("zh-Hant-TW", "zt"), ("zt", "zt"), ("sr-Cyrl", "sr"), ("fr-Latn-CA", "fr"), ("auto", "auto"),
    ],
)  # fmt: skip
def test_a_tag_is_the_served_code_of_its_language_and_script(tag: str, code: str) -> None:
    assert served_code(tag, SERVED) == code


def test_a_script_with_no_served_code_is_refused_by_name_not_folded() -> None:
    with pytest.raises(ApiError) as err:
        served_code("sr-Latn", SERVED)
    assert err.value.code == "unsupported_pair" and "Serbian (sr) in the Latn script" in err.value.detail
    with pytest.raises(ApiError) as err:
        served_code("zh-Hant", {"en", "zh"})  # Traditional Chinese, where only Simplified is served
    assert "in the Hant script" in err.value.detail and "served: zh, in Hans" in err.value.detail


@pytest.mark.slow
def test_the_apis_take_tags_as_clients_write_them(server: str) -> None:
    text = "A dog is running in the snow."
    want = httpx.post(f"{server}/v1/translate", json={"texts": [text], "source": "en", "target": "de"}).json()
    for target in ("de-DE", "DE-AT", "deu"):
        r = httpx.post(f"{server}/v1/translate", json={"texts": [text], "source": "en-US", "target": target})
        assert r.status_code == 200 and r.json()["translations"] == want["translations"], (target, r.text)
    r = httpx.post(f"{server}/v2/translate", json={"text": [text], "source_lang": "EN", "target_lang": "DE"})
    assert r.status_code == 200
    r = httpx.post(f"{server}/v2/translate", json={"text": [text], "target_lang": "ZH-HANT"})
    assert r.status_code == 400 and "Chinese (zh) in the Hant script" in r.json()["message"], r.text
