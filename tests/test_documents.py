"""Documents (service/documents.py, service/document_jobs.py): each format's prose found and put back
with everything else as it came, and DeepL's document API through the official `deepl` package on
the real server, a document's translation equal to its paragraphs translated on /v1."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from service import documents
from service.errors import ApiError

TEXT = "\ufeffA man is riding a bike.\n\n  Two dogs play in the snow. They are happy.  \r\nA woman sings.\n"
HTML = (
    "<!DOCTYPE html><html><head><title>A dog</title><style>p {color: red}</style></head>"
    "<body><p>A man in a <b>red shirt</b> is riding a bike.</p><pre>keep = 1</pre>"
    "<p translate='no'>Acme <i>Cloud</i></p><p>A <span translate='no'>Acme <b>X</b></span> shirt.</p></body></html>"
)
SRT = (
    "1\n00:00:01,000 --> 00:00:03,500\n<i>A man is riding</i>\na bike.\n\n"
    "2\n00:00:04,000 --> 00:00:05,000\nTwo dogs & a cat.\n\n"
    "3\n00:00:06,000 --> 00:00:07,000\n\n"
)


def test_each_format_gives_back_what_it_took_when_nothing_is_translated() -> None:
    for name, text in (("a.txt", TEXT), ("a.html", HTML), ("a.HTM", HTML)):
        parsed = documents.parse(name, text.encode())
        assert parsed.rebuild(parsed.segments) == text.encode(), name
    parsed = documents.parse("a.txt", TEXT.encode())
    assert parsed.segments == [
        "A man is riding a bike.",
        "Two dogs play in the snow. They are happy.",
        "A woman sings.",
    ]
    html = documents.parse("a.html", HTML.encode())
    assert html.html and html.segments == [
        "A dog",
        "A man in a <b>red shirt</b> is riding a bike.",
        "A <span translate='no'>Acme <b>X</b></span> shirt.",
    ]
    srt = documents.parse("a.srt", SRT.encode())
    assert srt.segments == ["<i>A man is riding</i> a bike.", "Two dogs &amp; a cat."]
    out = srt.rebuild(["<i>Ein Mann fährt</i> Fahrrad.", "Zwei Hunde &amp; eine Katze."]).decode()
    # Numbers and timings as they came; a cue's text over as many lines as it had, unescaped.
    assert out == (
        "1\n00:00:01,000 --> 00:00:03,500\n<i>Ein Mann\nfährt</i> Fahrrad.\n\n"
        "2\n00:00:04,000 --> 00:00:05,000\nZwei Hunde & eine Katze.\n\n"
        "3\n00:00:06,000 --> 00:00:07,000\n"
    )


@pytest.mark.parametrize(
    ("name", "data", "code", "needle"),
    [
        ("report.pdf", b"%PDF-1.7", "unsupported_document", ".txt, .html, .htm, .srt"),
        ("notes", b"A dog.", "unsupported_document", "'notes'"),
        ("latin1.txt", "Caf\xe9".encode("latin-1"), "invalid_document", "not UTF-8 text (byte 3)"),
        ("a.srt", b"1\nA dog without a time.\n", "invalid_document", "subtitle 1 has no timing line"),
        ("a.html", b"<p>A dog <b", "invalid_document", "ends inside a tag"),
        ("big.txt", b"A dog runs.\n" * 50_000, "document_too_large", "at most 500000"),
    ],
)
def test_a_document_that_cannot_be_read_is_refused_by_name(name: str, data: bytes, code: str, needle: str) -> None:
    with pytest.raises(ApiError) as err:
        documents.parse(name, data)
    assert err.value.code == code and needle in err.value.detail, err.value.detail


def test_subtitle_lines_are_balanced_between_words() -> None:
    assert documents._wrap("Zwei Hunde spielen im Schnee", 2) == ["Zwei Hunde", "spielen im Schnee"]
    assert documents._wrap("Hallo", 2) == ["Hallo"]
    assert documents._wrap("a b c", 3) == ["a", "b", "c"]


# -- on the real server ------------------------------------------------------------------------------


@pytest.fixture()
def client(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=60) as c:
        yield c


def on_v1(client: httpx.Client, texts: list[str], **extra: object) -> list[str]:
    r = client.post("/v1/translate", json={"texts": texts, "source": "en", "target": "de", **extra})
    assert r.status_code == 200, r.text
    return [t["text"] for t in r.json()["translations"]]


def document(translator: Any, data: bytes, **options: Any) -> bytes:
    """translate_document's file, as the deepl package writes it."""
    out = io.BytesIO()
    translator.translate_document(data, out, **options)
    return out.getvalue()


def test_the_deepl_client_translates_each_format_as_v1_translates_its_paragraphs(
    client: httpx.Client, server: str
) -> None:
    import deepl

    translator = deepl.Translator("any-key", server_url=server)
    for name, text in (("notes.txt", TEXT), ("page.html", HTML), ("film.srt", SRT)):
        parsed = documents.parse(name, text.encode())
        want = parsed.rebuild(on_v1(client, parsed.segments, **({"tag_handling": "html"} if parsed.html else {})))
        got = document(translator, text.encode(), target_lang="DE", filename=name)
        assert got == want, name
    handle = translator.translate_document_upload(TEXT.encode(), target_lang="DE", source_lang="EN", filename="a.txt")
    status = translator.translate_document_get_status(handle)
    assert status.done and status.billed_characters == documents.parse("a.txt", TEXT.encode()).characters
    # A glossary applies to a document as to a text.
    made = translator.create_glossary("d", "EN", "DE", {"bike": "Velo"})
    got = document(translator, TEXT.encode(), source_lang="EN", target_lang="DE", filename="a.txt", glossary=made)
    first = got.decode().removeprefix(documents.BOM).splitlines()[0]
    assert first == on_v1(client, ["A man is riding a bike."], glossary=made.glossary_id)[0] and "Velo" in first
    translator.delete_glossary(made)


def test_documents_are_refused_by_name_and_read_only_with_their_key(client: httpx.Client, server: str) -> None:
    import deepl

    translator = deepl.Translator("any-key", server_url=server)
    with pytest.raises(deepl.DeepLException, match=re.escape("documents are .txt, .html, .htm, .srt")):
        translator.translate_document_upload(b"%PDF-1.7", target_lang="DE", filename="report.pdf")
    with pytest.raises(deepl.DeepLException, match="a document comes back in its own format"):
        translator.translate_document_upload(TEXT.encode(), target_lang="DE", filename="a.txt", output_format="docx")
    handle = translator.translate_document_upload(TEXT.encode(), target_lang="DE", filename="a.txt")
    r = client.post(f"/v2/document/{handle.document_id}", json={"document_key": "0" * 48})
    assert r.status_code == 403 and "document_key" in r.json()["message"]
    r = client.post("/v2/document/ABC123/result", json={"document_key": handle.document_key})
    assert r.status_code == 404
    r = client.post(f"/v2/document/{handle.document_id}/result", data={"document_key": handle.document_key})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert "filename*=UTF-8''a.txt" in r.headers["content-disposition"]
    r = client.post("/v2/document", data={"target_lang": "DE"})
    assert r.status_code == 415


def test_libretranslate_s_file_route_answers_the_address_of_the_translation(client: httpx.Client) -> None:
    parsed = documents.parse("notes.txt", TEXT.encode())
    want = parsed.rebuild(on_v1(client, parsed.segments))
    files = {"file": ("notes.txt", TEXT.encode(), "text/plain")}
    r = client.post("/translate_file", files=files, data={"source": "auto", "target": "de"})
    assert r.status_code == 200, r.text
    url = r.json()["translatedFileUrl"]
    assert url.startswith(str(client.base_url)) and url.endswith("/notes.txt")
    got = httpx.get(url)
    assert got.status_code == 200 and got.content == want
    # The address is the secret: another key in it finds nothing.
    handle = url.split("/download_file/")[1].split("/")[0]
    doc, key = handle.split("-")
    assert client.get(f"/download_file/{doc}-{'0' * len(key)}/notes.txt").status_code == 404
    r = client.post("/translate_file", files={"file": ("a.pdf", b"%PDF", "application/pdf")}, data={"target": "de"})
    assert r.status_code == 400 and "documents are .txt" in r.json()["error"]
