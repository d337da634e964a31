"""A Hugging Face hub on 127.0.0.1 for the tests: the part of the hub's HTTP API that huggingface_hub's
snapshot_download uses, serving one model directory built in the test under one repository id at one
commit (nothing reaches the internet)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

COMMIT = "5f1e0c2a9b7d4e3f8a6c1b0d2e4f6a8c0e2d4b6a"


class Hub(BaseHTTPRequestHandler):
    """The hub's file API for `repo_id` at COMMIT, its files those of `root`."""

    root: Path
    repo_id: str

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
        if path.startswith(f"/api/models/{self.repo_id}/tree/"):
            blobs = {f: (self.root / f).read_bytes() for f in files}
            tree = [
                {"type": "file", "path": f, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                for f, b in blobs.items()
            ]
            return self._send(200, json.dumps(tree).encode(), as_json, body)
        if path.startswith(f"/api/models/{self.repo_id}/revision/"):
            info = {"id": self.repo_id, "sha": COMMIT, "private": False, "siblings": [{"rfilename": f} for f in files]}
            return self._send(200, json.dumps(info).encode(), as_json, body)
        prefix = f"/{self.repo_id}/resolve/"
        if path.startswith(prefix):
            name = path[len(prefix) :].partition("/")[2]
            if name in files:
                data = (self.root / name).read_bytes()
                etag = f'"{hashlib.sha1(data).hexdigest()}"'
                return self._send(200, data, {"X-Repo-Commit": COMMIT, "ETag": etag}, body)
            return self._send(404, headers={"X-Error-Code": "EntryNotFound"}, body=body)
        self._send(404, headers={"X-Error-Code": "RepoNotFound"}, body=body)


@contextlib.contextmanager
def local_hub(root: Path, repo_id: str) -> Iterator[str]:
    """The hub's address (for HF_ENDPOINT) while it serves directory `root` as `repo_id` at COMMIT."""
    handler = type("ThisHub", (Hub,), {"root": root, "repo_id": repo_id})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
