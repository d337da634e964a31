"""Models by their Hugging Face id: `beamserve download` fetches one into the Hugging Face cache with
huggingface_hub's own download, from a hub this test serves on 127.0.0.1 (the hub's file API over a model
directory built here; nothing reaches the internet), and the id then names the model offline, its
revision recorded."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from model import Translator
from model.io import checkpoint

from .conftest import REPO
from .hub import COMMIT, local_hub

REPO_ID = "beamserve-test/opus-mt-en-de"


@pytest.fixture(scope="module")
def hub(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(the hub's address, the model directory it serves as REPO_ID: a Hugging Face MarianMT directory)."""
    model = tmp_path_factory.mktemp("hub") / "opus-mt-en-de"
    checkpoint.export_hf(tiny_dir, model)
    with local_hub(model, REPO_ID) as url:
        yield url, model


def run(args: list[str], env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "HF_HUB_DISABLE_TELEMETRY": "1", **env}
    if "HF_HUB_OFFLINE" not in env:
        full.pop("HF_HUB_OFFLINE", None)
    return subprocess.run(args, cwd=REPO, env=full, input=stdin, capture_output=True, text=True, timeout=180)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "service.cli", *args]


def test_a_model_downloaded_by_its_id_serves_by_its_id_offline(
    hub: tuple[str, Path], tmp_path: Path, sources: list[str]
) -> None:
    url, model = hub
    cache = {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": url}
    fetched = run(cli("download", REPO_ID), cache)
    assert fetched.returncode == 0, fetched.stderr[-2000:]
    assert f"serve it with `beamserve serve --models {REPO_ID}`" in fetched.stdout
    offline = {**cache, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}  # nothing to reach
    text = "\n".join(sources[:6]) + "\n"
    by_id = run(cli("translate", "--model", REPO_ID, "--quiet"), offline, text)
    by_dir = "".join(r.hypotheses[0] + "\n" for r in Translator.load(model, "cpu").translate(sources[:6]))
    assert by_id.returncode == 0 and by_id.stdout == by_dir and by_dir.count("\n") == 6, by_id.stderr
    probe = (
        "from model import Translator; from service.registry import pair_of; "
        f"t = Translator.load({REPO_ID!r}, 'cpu'); print(t.revision, pair_of({REPO_ID!r}))"
    )
    found = run([sys.executable, "-c", probe], offline)
    assert found.stdout.split() == [COMMIT, "en-de"], found.stderr[-2000:]


def test_an_id_not_in_the_cache_or_not_on_the_hub_is_one_line_and_exit_2(hub: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = hub
    cache = {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": url}
    missing = run(cli("translate", "--model", REPO_ID, "--quiet"), {**cache, "HF_HUB_OFFLINE": "1"}, "A dog.\n")
    assert missing.returncode == 2 and f"`beamserve download {REPO_ID}` fetches it" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1, missing.stderr
    unknown = run(cli("download", "beamserve-test/no-such-model"), cache)
    assert unknown.returncode == 2 and "could not be fetched" in unknown.stderr, unknown.stderr[-2000:]
    assert len(unknown.stderr.strip().splitlines()) == 1, unknown.stderr
    with contextlib.suppress(FileNotFoundError):
        assert not any((tmp_path / "hf" / "hub").rglob("*.safetensors"))
