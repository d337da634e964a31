"""DeepL's request body read into beamserve's (service/api/deepl.py), and its error shape."""

from __future__ import annotations

import pytest

from service.api import deepl
from service.errors import ApiError


def test_deepl_codes_options_and_defaults() -> None:
    body = {"text": "A dog.", "target_lang": "EN-GB", "source_lang": "DE", "split_sentences": 0}
    original, req = deepl.parse(body)
    # The tags as DeepL's client sends them; the router reads them as served codes (service/text/language_tags.py).
    assert original.text == ["A dog."] and (req.source, req.target) == ("de", "en-gb")
    assert req.split_sentences is False and req.tag_handling is None
    _, req = deepl.parse({"text": ["a", "b"], "target_lang": "pt-br", "tag_handling": "html", "ignore_tags": "x,y"})
    assert req.source is None and req.target == "pt-br" and req.split_sentences is True
    assert req.tag_handling == "html" and req.ignore_tags == ["x", "y"]
    assert [lang.language for lang in deepl.languages(["de-en", "en-pt"], "target")] == [
        "EN-GB",
        "EN-US",
        "PT-BR",
        "PT-PT",
    ]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"glossary_id": "g"}, "a glossary needs the source language named"),
        ({"glossary_ids": ["g"]}, "pass one glossary_id"),
        ({"formality": "more"}, "formality is not supported"),
        ({"tag_handling": "xml"}, "xml is not supported"),
        ({"split_sentences": "2"}, "split_sentences"),
        ({"frobnicate": True}, "frobnicate"),
        ({"text": []}, "text"),
    ],
)
def test_what_deepl_options_beamserve_refuses(body: dict[str, object], needle: str) -> None:
    with pytest.raises(ApiError) as err:
        deepl.parse({"text": ["A dog."], "target_lang": "DE", **body})
    # 400 as DeepL's clients get it (an invalid_request is 422 on beamserve's own routes).
    assert deepl.error(err.value.status, err.value.body())[0] == 400 and needle in err.value.detail


def test_errors_in_deepl_s_shape_and_statuses() -> None:
    assert deepl.error(422, {"error": "invalid_request", "detail": [{"loc": ["x"], "msg": "bad"}]}) == (
        400,
        {"message": "x: bad", "code": "invalid_request"},
    )
    assert deepl.error(429, {"error": "quota_exceeded", "detail": "d"})[0] == 456
    assert deepl.error(503, {"error": "overloaded", "detail": "d"})[0] == 429
    assert deepl.error(401, {"error": "missing_api_key", "detail": "d"})[0] == 403
    assert deepl.error(504, {"error": "timeout", "detail": "d"}) == (504, {"message": "d", "code": "timeout"})
