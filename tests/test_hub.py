"""Models by their Hugging Face id: `beamserve download` fetches one into the Hugging Face cache with
huggingface_hub's own download, from a hub this test serves on 127.0.0.1 (the hub's file API over a model
directory built here; nothing reaches the internet), and the id then names the model offline, its
revision recorded."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import pytest

from model.io import checkpoint

from .conftest import REPO

REPO_ID = "beamserve-test/opus-mt-en-de"
COMMIT = "5f1e0c2a9b7d4e3f8a6c1b0d2e4f6a8c0e2d4b6a"


class Hub(BaseHTTPRequestHandler):
    """The part of the hub's HTTP API huggingface_hub's snapshot_download uses, for one model at COMMIT."""

    root: Path

    def log_message(self, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _send(self, status: int, data: bytes = b"", headers: dict[str, str] | None = None, body: bool = True) -> None:
        self.send_response(status)
        for k, v in {"Content-Length": str(len(data)), **(headers or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _answer(self, body: bool) -> None:
        path = unquote(self.path.split("?")[0])
        files = sorted(p.name for p in self.root.iterdir() if p.is_file())
        as_json = {"Content-Type": "application/json"}
        if path.startswith(f"/api/models/{REPO_ID}/tree/"):
            blobs = {f: (self.root / f).read_bytes() for f in files}
            tree = [
                {"type": "file", "path": f, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                for f, b in blobs.items()
            ]
            return self._send(200, json.dumps(tree).encode(), as_json, body)
        if path.startswith(f"/api/models/{REPO_ID}/revision/"):
            info = {"id": REPO_ID, "sha": COMMIT, "private": False, "siblings": [{"rfilename": f} for f in files]}
            return self._send(200, json.dumps(info).encode(), as_json, body)
        prefix = f"/{REPO_ID}/resolve/"
        if path.startswith(prefix):
            name = path[len(prefix) :].partition("/")[2]
            if name in files:
                data = (self.root / name).read_bytes()
                etag = f'"{hashlib.sha1(data).hexdigest()}"'
                return self._send(200, data, {"X-Repo-Commit": COMMIT, "ETag": etag}, body)
            return self._send(404, headers={"X-Error-Code": "EntryNotFound"}, body=body)
        self._send(404, headers={"X-Error-Code": "RepoNotFound"}, body=body)


@pytest.fixture(scope="module")
def hub(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(the hub's address, the model directory it serves as REPO_ID: a Hugging Face MarianMT directory)."""
    model = tmp_path_factory.mktemp("hub") / "opus-mt-en-de"
    checkpoint.export_hf(tiny_dir, model)
    handler = type("ThisHub", (Hub,), {"root": model})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", model
    finally:
        server.shutdown()


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
    by_dir = run(cli("translate", "--model", str(model), "--quiet"), {}, text)
    assert by_id.returncode == 0 and by_id.stdout == by_dir.stdout and by_id.stdout.count("\n") == 6, by_id.stderr
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
