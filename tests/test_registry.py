"""The model registry: entries parsed and checked, and a real server that serves what it lists: a
shipped model with a setting of its own (int8), and a multilingual Marian model (built here with
transformers) that answers two pairs, routed by target language through its >>xx<< tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from model import Translator
from service.registry import ModelEntry, entries

from .conftest import REPO, free_port

ROMANCE = {
    "name": "en-multi",
    "sources": ["en"],
    "targets": ["fr", "es"],
    "target_tokens": {"fr": ">>fra<<", "es": ">>spa<<"},
}


def test_models_alone_make_one_entry_per_pair() -> None:
    found = entries("en-de, en-fr", "")
    assert [(e.name, e.path, e.pairs) for e in found] == [("en-de", "en-de", ["en-de"]), ("en-fr", "en-fr", ["en-fr"])]


def test_a_registry_lists_languages_tokens_and_settings(tmp_path: Path) -> None:
    registry = [
        {**ROMANCE, "path": "/models/opus-mt-en-ROMANCE", "settings": {"compute_type": "int8", "max_batch_size": 8}},
        {"name": "de-en", "path": "/models/opus-mt-de-en", "sources": ["DE"], "targets": ["en"]},
    ]
    for given in (json.dumps(registry), registry):  # inline JSON (the environment) or a list (Serve config)
        found = entries("ignored", given)
        assert [e.pairs for e in found] == [["en-fr", "en-es"], ["de-en"]]
    path = tmp_path / "models.yaml"
    path.write_text("- " + json.dumps(registry[1]) + "\n")  # YAML, from a file
    assert entries("", str(path))[0].sources == ["de"]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"targets": ["fr", "es"], "target_tokens": {"fr": ">>fra<<"}}, "needs a token for each; none for ['es']"),
        ({"target_tokens": {"fr": "fra", "es": ">>spa<<"}}, "looks like >>fra<<"),
        ({"target_tokens": {"fr": ">>fra<<", "es": ">>spa<<", "it": ">>ita<<"}}, "does not list as targets"),
        ({"sources": ["english"]}, "2 or 3 letters"),
        ({"settings": {"api_keys": "x"}}, "settings an entry cannot set: ['api_keys']"),
        ({"name": "Bad Name"}, "name"),
    ],
)
def test_a_bad_entry_is_refused_with_what_is_wrong(entry: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        entries("", [{**ROMANCE, "path": "x", **entry}])


def test_two_models_for_one_pair_are_refused() -> None:
    with pytest.raises(ValueError, match="en-fr is answered by two models: en-multi and en-fr"):
        entries("", [{**ROMANCE, "path": "x"}, {"name": "en-fr", "path": "y", "sources": ["en"], "targets": ["fr"]}])


@pytest.fixture(scope="module")
def multilingual_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from .test_marian_layouts import save_marian, small_config

    vocab = json.loads((tiny_dir / "vocab.json").read_text(encoding="utf-8"))
    vocab.pop("<pad>")
    for code in (">>fra<<", ">>spa<<"):
        vocab[code] = len(vocab)
    vocab["<pad>"] = len(vocab)
    config = small_config(vocab_size=len(vocab), pad_token_id=vocab["<pad>"], decoder_start_token_id=vocab["<pad>"])
    return save_marian(config, tmp_path_factory.mktemp("multi") / "opus-mt-en-multi", tiny_dir, vocab)


@pytest.fixture(scope="module")
def served(multilingual_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    registry = tmp_path_factory.mktemp("registry") / "models.json"
    shipped = {"name": "en-de", "path": "en-de", "sources": ["en"], "targets": ["de"]}
    registry.write_text(
        json.dumps([{**shipped, "settings": {"compute_type": "int8"}}, {**ROMANCE, "path": str(multilingual_dir)}])
    )
    port = free_port()
    env = {**os.environ, "BEAMSERVE_MODEL_REGISTRY": str(registry), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--metrics-port", str(free_port())]
    proc = subprocess.Popen(
        [*cmd, "--num-cpus", "2"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None
        assert "listening on" in proc.stdout.readline()
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}/readyz", timeout=10).json().get("pairs", {}).get("en-es") != "ready":
            assert time.monotonic() < deadline, "not ready within 60s"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(60)


@pytest.mark.slow
def test_the_server_serves_what_the_registry_lists(served: str, multilingual_dir: Path, sources: list[str]) -> None:
    models = {m["name"]: m for m in httpx.get(f"{served}/v1/models", timeout=10).json()["models"]}
    assert set(models) == {"en-de", "en-fr", "en-es"}
    assert (models["en-de"]["model"], models["en-de"]["compute_type"]) == ("en-de", "int8")  # its own setting
    assert models["en-fr"]["model"] == models["en-es"]["model"] == "en-multi"
    assert models["en-fr"]["digest"] == models["en-es"]["digest"] != models["en-de"]["digest"]
    languages = {lang["code"]: lang["targets"] for lang in httpx.get(f"{served}/languages", timeout=10).json()}
    assert languages["en"] == ["de", "es", "fr"]
    deepl = {lang["language"] for lang in httpx.get(f"{served}/v2/languages?type=target", timeout=10).json()}
    assert {"DE", "ES", "FR"} <= deepl

    # Each target through its token: the same as the model given the token itself.
    local = Translator.load(multilingual_dir, "cpu")
    texts = sources[:4]
    for target, token in ROMANCE["target_tokens"].items():  # type: ignore[attr-defined]
        body = {"texts": texts, "source": "en", "target": target, "beam_size": 4, "split_sentences": False}
        r = httpx.post(f"{served}/v1/translate", json=body, timeout=60)
        assert r.status_code == 200, r.text
        expected = [x.hypotheses[0] for x in local.translate([f"{token} {t}" for t in texts], beam_size=4)]
        assert [t["text"] for t in r.json()["translations"]] == expected
    fr, es = (
        httpx.post(f"{served}/v1/translate", json={"texts": texts, "source": "en", "target": t}, timeout=60).json()
        for t in ("fr", "es")
    )
    assert fr["translations"] != es["translations"]
    # Markup placed by alignment: the target token is the model's, the spans are the text's.
    html = {"texts": ["A <b>man</b> runs."], "source": "en", "target": "fr", "tag_handling": "html"}
    r = httpx.post(f"{served}/v1/translate", json=html, timeout=60)
    assert r.status_code == 200 and r.json()["translations"][0]["text"].count("<b>") == 1
    unknown = httpx.post(f"{served}/v1/translate", json={"texts": ["x"], "source": "en", "target": "it"}, timeout=10)
    assert unknown.status_code == 400 and "en-es, en-fr" in unknown.json()["detail"]


def test_entries_carry_settings_over_the_servers() -> None:
    from service.settings import Settings

    settings = Settings(model_registry=[{**ROMANCE, "path": "x", "settings": {"compute_type": "int8"}}])
    [entry] = settings.entries()
    assert isinstance(entry, ModelEntry)
    own = settings.for_entry(entry)
    assert (own.compute_type, settings.compute_type, own.max_texts) == ("int8", None, settings.max_texts)
