"""Translation memories: TMX read and written (service/text/tmx.py), the lookup (service/text/memory.py),
and the routes on the shared server: a sentence the memory holds comes back from it, marked, the others
exactly as the model translates them alone."""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.errors import ApiError
from service.text import tmx
from service.text.memory import SCAN_ALL, MemoryIndex, normal

from .conftest import read_lines

TMX = b"""<?xml version="1.0" encoding="UTF-8"?>
<tmx version="1.4"><header srclang="en-US" segtype="sentence" datatype="plaintext" adminlang="en"
 creationtool="t" creationtoolversion="1" o-tmf="t"/>
<body>
<tu><tuv xml:lang="en-US"><seg>A dog  is <hi>running</hi> in the snow.</seg></tuv>
    <tuv xml:lang="DE-de"><seg>Ein Hund rennt <bpt i="1">&lt;b&gt;</bpt>im<ept i="1">&lt;/b&gt;</ept>
    Schnee.</seg></tuv></tu>
<tu><tuv lang="en"><seg>Hello {name}, welcome.</seg></tuv><tuv lang="de"><seg>Hallo {name}, willkommen.</seg></tuv></tu>
<tu><tuv xml:lang="en"><seg>Only one side.</seg></tuv></tu>
<tu><tuv xml:lang="en"><seg>A cat sleeps.</seg></tuv><tuv xml:lang="fr"><seg>Un chat dort.</seg></tuv></tu>
</body></tmx>"""


def test_tmx_gives_a_pairs_units_without_native_codes_and_writes_back_what_it_read() -> None:
    units = tmx.read(TMX, "en", "de")
    assert units == {
        "A dog is running in the snow.": "Ein Hund rennt im Schnee.",
        "Hello {name}, welcome.": "Hallo {name}, willkommen.",
    }
    assert tmx.read(TMX, "en", "fr") == {"A cat sleeps.": "Un chat dort."}
    odd = {"a < b & c": 'd > "e"', "Zwei  Leer": "x"}
    assert tmx.read(tmx.write(odd, "en", "de"), "en", "de") == {"a < b & c": 'd > "e"', "Zwei Leer": "x"}


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"<html><body/></html>", "not TMX"),
        (b"<tmx><body><tu>", "does not parse"),
        (b'<!DOCTYPE tmx [<!ENTITY x "y">]><tmx version="1.4"><body/></tmx>', "DTD"),
    ],
)
def test_a_file_that_is_not_tmx_is_refused_by_name(data: bytes, needle: str) -> None:
    with pytest.raises(ApiError) as caught:
        tmx.read(data, "en", "de")
    assert caught.value.code == "invalid_memory" and needle in caught.value.detail


def test_exact_matches_normalise_whitespace_and_rename_placeholders() -> None:
    index = MemoryIndex({"Hello {name}, welcome.": "Hallo {name}, willkommen.", "Two  words": "Zwei Wörter"})
    found = index.lookup("Hello {user},   welcome.", 1.0)
    assert found is not None and (found.target, found.score) == ("Hallo {user}, willkommen.", 1.0)
    assert index.lookup(" Two words ", 1.0) is not None
    assert index.lookup("Hello {user}, welcome!", 1.0) is None
    near = index.lookup("Hello {user}, welcome!", 0.9)
    assert near is not None and 0.9 <= near.score < 1.0 and near.target == "Hallo {name}, willkommen."


def test_a_large_memory_finds_what_scoring_every_unit_finds() -> None:
    """Past SCAN_ALL units the lookup scores the units sharing most words with the sentence: on edited test
    sentences it finds the unit and score a full scan finds."""
    from rapidfuzz import fuzz, process

    english, german = read_lines("train.en.gz"), read_lines("train.de.gz")
    units = {
        f"{e} ({i // len(english)})" if i >= len(english) else e: german[i % len(german)]
        for i, e in enumerate(english * (SCAN_ALL * 2 // len(english) + 1))
    }
    index = MemoryIndex(units)
    assert len(index) > SCAN_ALL and index.postings
    rng = random.Random(3)
    for _ in range(60):
        words = rng.choice(english).split()
        words[rng.randrange(len(words))] = "zebra"
        query = " ".join(words)
        got = index.lookup(query, 0.8)
        full = process.extractOne(normal(query), index.keys, scorer=fuzz.ratio, score_cutoff=80)
        assert (got is None) == (full is None), query
        if got is not None and full is not None:
            assert round(got.score, 4) == round(min(full[1] / 100, 0.9999), 4), query


@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_two_replicas_approving_into_one_memory_at_once_keep_every_unit(
    store: str, tmp_path: Path, redis_url: str
) -> None:
    """Two replicas' Memories over one records store (an SQLite file, a real Redis server), each adding units
    one request at a time, all at once: every unit is there after (the write claim), none lost to a write
    that read the memory before the other's landed."""
    import asyncio

    from service.store.memories import Memories
    from service.store.records import open_records

    url = f"sqlite:///{tmp_path}/records.sqlite3" if store == "sqlite" else redis_url

    async def run() -> int:
        first, second = Memories(open_records(url)), Memories(open_records(url))
        made = await first.create("key", "shared", "en", "de", {"A cat.": "Eine Katze."})
        adds = [
            replica.add(made.memory_id, "key", {f"Sentence {i} of {name}.": f"Satz {i}."})
            for i in range(12)
            for name, replica in (("one", first), ("two", second))
        ]
        await asyncio.gather(*adds)
        return len((await second.get(made.memory_id, "key")).units)

    assert asyncio.run(run()) == 25


@pytest.fixture(scope="module")
def client(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=60) as c:
        yield c


def made(client: httpx.Client, data: bytes = TMX, source: str = "en", target: str = "de") -> str:
    r = client.post(
        "/v1/memories",
        files={"file": ("memory.tmx", data)},
        data={"name": "test memory", "source_lang": source, "target_lang": target},
    )
    assert r.status_code == 201, r.text
    return str(r.json()["memory_id"])


def translated(client: httpx.Client, texts: list[str], **extra: object) -> list[dict[str, object]]:
    r = client.post("/v1/translate", json={"texts": texts, "source": "en", "target": "de", **extra})
    assert r.status_code == 200, r.text
    return list(r.json()["translations"])


def test_sentences_the_memory_holds_come_from_it_and_the_rest_as_the_model_gives_them(client: httpx.Client) -> None:
    memory = made(client)
    assert client.get(f"/v1/memories/{memory}").json()["units"] == 2
    other = "Two men are sitting on a bench."
    alone = translated(client, [other])[0]
    assert (alone["origin"], alone["memory_matches"]) == (None, None)
    out = translated(
        client, ["A dog is running in the snow.", f"A dog is running in the snow. {other}", other], memory=memory
    )
    assert (out[0]["text"], out[0]["origin"], out[0]["memory_matches"]) == (
        "Ein Hund rennt im Schnee.",
        "memory",
        [1.0],
    )
    assert out[1]["origin"] == "mixed" and out[1]["memory_matches"] == [1.0, None]
    assert out[1]["text"] == f"Ein Hund rennt im Schnee. {alone['text']}"
    assert (out[2]["text"], out[2]["origin"], out[2]["memory_matches"]) == (alone["text"], "model", [None])
    near = translated(client, ["A dog is running in the snow!"], memory={"id": memory, "min_match": 0.9})[0]
    assert near["text"] == "Ein Hund rennt im Schnee." and 0.9 <= near["memory_matches"][0] < 1.0  # type: ignore[index]
    assert translated(client, ["A dog is running in the snow!"], memory=memory)[0]["origin"] == "model"
    html = translated(client, ["<p>A dog is running in the snow.</p>"], memory=memory, tag_handling="html")[0]
    assert html["text"] == "<p>Ein Hund rennt im Schnee.</p>" and html["origin"] == "memory"
    bold = translated(client, ["<p>A <b>dog</b> is running in the snow.</p>"], memory=memory, tag_handling="html")[0]
    assert bold["origin"] == "memory" and "<b>Hund</b>" in str(bold["text"]), bold
    # A glossary's terms still win: placed on the memory's translation as on the model's.
    termed = translated(client, ["A dog is running in the snow."], memory=memory, glossary={"dog": "Köter"})[0]
    assert termed["origin"] == "memory" and termed["text"] == "Ein Köter rennt im Schnee.", termed


def test_an_approved_translation_answers_from_then_on_and_the_memory_reads_back_as_tmx(client: httpx.Client) -> None:
    memory = made(client)
    sentence = "A little girl climbs into a wooden playhouse."
    r = client.post(f"/v1/memories/{memory}/units", json={"units": [{"source": sentence, "target": "Freigegeben."}]})
    assert r.status_code == 200 and r.json()["units"] == 3, r.text
    assert translated(client, [sentence], memory=memory)[0]["text"] == "Freigegeben."
    exported = client.get(f"/v1/memories/{memory}/tmx")
    assert exported.status_code == 200 and exported.headers["content-type"].startswith("application/x-tmx+xml")
    assert tmx.read(exported.content, "en", "de") == {**tmx.read(TMX, "en", "de"), sentence: "Freigegeben."}
    assert memory in [m["memory_id"] for m in client.get("/v1/memories").json()["memories"]]
    assert client.delete(f"/v1/memories/{memory}").status_code == 204
    assert client.get(f"/v1/memories/{memory}").json()["error"] == "memory_not_found"


def test_the_compatible_apis_and_deepl_s_own_client_answer_from_a_memory(client: httpx.Client, server: str) -> None:
    import deepl

    memory = made(client)
    translator = deepl.DeepLClient("any", server_url=server)
    assert memory in [m.translation_memory_id for m in translator.list_translation_memories()]
    out = translator.translate_text(
        "A dog is running in the snow!",
        source_lang="EN",
        target_lang="DE",
        translation_memory=memory,
        translation_memory_threshold=90,
    )
    assert out.text == "Ein Hund rennt im Schnee."
    raw = client.post(
        "/v2/translate",
        json={
            "text": ["A dog is running in the snow."],
            "source_lang": "EN",
            "target_lang": "DE",
            "translation_memory_id": memory,
            "translation_memory_threshold": 100.0,  # an integer to JSON Schema, as the document says it
        },
    ).json()
    assert raw["translations"][0]["origin"] == "memory" and raw["translations"][0]["memory_matches"] == [1.0]
    libre = client.post(
        "/translate", json={"q": "A dog is running in the snow.", "source": "en", "target": "de", "memory": memory}
    ).json()
    assert (libre["translatedText"], libre["origin"], libre["memory_matches"]) == (
        "Ein Hund rennt im Schnee.",
        "memory",
        [1.0],
    )


def test_a_document_s_paragraphs_the_memory_holds_come_from_it(client: httpx.Client, server: str) -> None:
    """DeepL's document upload with its client's translation_memory, and LibreTranslate's /translate_file with
    `memory`: a paragraph the memory holds is its unit's translation, the others the model's as /v1 gives them."""
    import io

    import deepl

    memory = made(client)
    other = "Two men are sitting on a bench."
    text = f"A dog is running in the snow.\n\n{other}\n".encode()
    model = translated(client, [other])[0]["text"]
    out = io.BytesIO()
    translator = deepl.DeepLClient("any", server_url=server)
    translator.translate_document(
        text, out, source_lang="EN", target_lang="DE", filename="a.txt", translation_memory=memory
    )
    assert out.getvalue().decode() == f"Ein Hund rennt im Schnee.\n\n{model}\n"
    files = {"file": ("notes.txt", text, "text/plain")}
    r = client.post("/translate_file", files=files, data={"source": "en", "target": "de", "memory": memory})
    assert r.status_code == 200, r.text
    assert httpx.get(r.json()["translatedFileUrl"]).text == f"Ein Hund rennt im Schnee.\n\n{model}\n"
    r = client.post("/v2/document", files=files, data={"target_lang": "DE", "translation_memory_id": memory})
    assert r.status_code == 400 and "needs the source language named" in r.text, r.text
    r = client.post(
        "/v2/document", files=files, data={"source_lang": "EN", "target_lang": "FR", "translation_memory_id": memory}
    )
    assert r.status_code == 400 and r.json()["message"].startswith("memory"), r.text


def test_memories_are_refused_by_name(client: httpx.Client) -> None:
    memory = made(client)
    r = client.post("/v1/translate", json={"texts": ["x"], "source": "en", "target": "fr", "memory": memory})
    assert r.status_code == 400 and r.json()["error"] == "memory_mismatch", r.text
    r = client.post("/v1/translate", json={"texts": ["x"], "source": "en", "target": "de", "memory": "0" * 32})
    assert r.status_code == 404 and r.json()["error"] == "memory_not_found"
    r = client.post("/v1/translate", json={"texts": ["x"], "target": "de", "memory": memory})
    assert r.status_code == 422 and "needs the source language named" in r.text
    bad = {"id": memory, "min_match": 1.5}
    r = client.post("/v1/translate", json={"texts": ["x"], "source": "en", "target": "de", "memory": bad})
    assert r.status_code == 422
    r = client.post(
        "/v1/memories", files={"file": ("m.tmx", b"<tmx")}, data={"name": "m", "source_lang": "en", "target_lang": "de"}
    )
    assert r.status_code == 400 and r.json()["error"] == "invalid_memory"
    unserved = {"name": "m", "source_lang": "en", "target_lang": "xx"}
    r = client.post("/v1/memories", files={"file": ("m.tmx", TMX)}, data=unserved)
    assert r.status_code == 400 and r.json()["error"] == "unsupported_pair"
    r = client.post("/v1/memories", files={"file": ("m.tmx", TMX)}, data={"source_lang": "en", "target_lang": "de"})
    assert r.status_code == 422 and "name" in r.json()["detail"]
    r = client.post(f"/v1/memories/{memory}/units", json={"units": [{"source": "", "target": "x"}]})
    assert r.status_code == 422


def test_the_command_line_imports_a_memory_the_server_answers_from_and_exports_it_again(
    client: httpx.Client, tmp_path: Path
) -> None:
    from .conftest import REPO, SETTINGS

    (tmp_path / "in.tmx").write_bytes(TMX)

    def beamserve(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "service.cli", "tm", *args, "--store", str(SETTINGS["records_storage"])]
        return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)

    made = beamserve("import", str(tmp_path / "in.tmx"), "--name", "cli", "--source", "EN", "--target", "de")
    assert made.returncode == 0, made.stderr
    memory, units = made.stdout.split("\t")
    assert units.strip() == "2 units" and memory in beamserve("list").stdout
    assert translated(client, ["A dog is running in the snow."], memory=memory)[0]["origin"] == "memory"
    exported = beamserve("export", memory)
    assert tmx.read(exported.stdout.encode(), "en", "de") == tmx.read(TMX, "en", "de")
    bad = beamserve("import", str(tmp_path / "in.tmx"), "--name", "x")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--source" in bad.stderr
