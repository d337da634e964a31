"""One summary line per HTTP request, a JSON object in the gateway replica's own requests file
(`requests_<app>_<deployment>_<replica>.log` beside Serve's replica logs, under Ray's
`logs/serve/`): request_id, route, method, status, pair, texts, characters, sentences,
cached_sentences (answered without decoding: from the cache, or a repeat within the request),
queue_wait_s (the longest any of its sentences waited to start decoding), decode_s (the longest a
replica call spent from the first of its sentences starting to the last finishing), duration_s,
client (the API key's name; "anonymous" while keys are off). Counts and times, never a text.

The line is encoded by orjson and written with one system call, not through Python's logging, whose
record, filters and formatter cost many times that. The file rotates as Ray's logs do
(RAY_ROTATION_MAX_BYTES, RAY_ROTATION_BACKUP_COUNT).

The ingress (service/api/http.py) opens a summary for each request (a context variable, which the tasks a
request spawns share); the routes and the pair router add to it as they learn.
"""

import contextvars
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

# Characters some readers take for line ends (Python's str.splitlines), escaped in the line's strings.
_LINE_BREAKS = [("\x85".encode(), b"\\u0085"), ("\u2028".encode(), b"\\u2028"), ("\u2029".encode(), b"\\u2029")]
MAX_BYTES = int(os.environ.get("RAY_ROTATION_MAX_BYTES", 512 * 1024 * 1024))
BACKUPS = int(os.environ.get("RAY_ROTATION_BACKUP_COUNT", 5))


@dataclass
class RequestSummary:
    request_id: str
    route: str
    method: str
    status: int = 0
    pairs: list[str] = field(default_factory=list)
    texts: int = 0
    characters: int = 0
    sentences: int = 0
    cached_sentences: int = 0
    queue_wait_s: float = 0.0
    decode_s: float = 0.0
    duration_s: float = 0.0
    client: str = ""
    # The pair the request's metrics count it under: the last one asked, "unknown" for a pair not served (a
    # label's values stay bounded), "" for a request that named none.
    metric_pair: str = ""

    def add_texts(self, pair: str, texts: list[str]) -> None:
        if pair not in self.pairs:
            self.pairs.append(pair)
        self.texts += len(texts)
        self.characters += sum(map(len, texts))

    def add_decoded(self, sentences: int, cached: int, queue_wait_s: float, decode_s: float) -> None:
        self.sentences += sentences
        self.cached_sentences += cached
        self.queue_wait_s = max(self.queue_wait_s, queue_wait_s)
        self.decode_s = max(self.decode_s, decode_s)

    def fields(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "route": self.route,
            "method": self.method,
            "status": self.status,
            "pair": ",".join(self.pairs),
            "texts": self.texts,
            "characters": self.characters,
            "sentences": self.sentences,
            "cached_sentences": self.cached_sentences,
            "queue_wait_s": round(self.queue_wait_s, 4),
            "decode_s": round(self.decode_s, 4),
            "duration_s": round(self.duration_s, 4),
            "client": self.client,
        }


_current: contextvars.ContextVar[RequestSummary | None] = contextvars.ContextVar("beamserve_request", default=None)


def start(request_id: str, route: str, method: str) -> RequestSummary:
    summary = RequestSummary(request_id, route, method)
    _current.set(summary)
    return summary


def current() -> RequestSummary:
    """The summary of the request being answered; a detached one outside a request (nothing logs it)."""
    return _current.get() or RequestSummary("", "", "")


class RequestFile:
    """JSON lines appended to one file, one write each (no buffer to lose), rotated past MAX_BYTES."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file: IO[bytes] = open(path, "ab", buffering=0)  # noqa: SIM115 (open for the replica's life)
        self.size = self.file.tell()

    def write(self, record: dict[str, Any]) -> None:
        line = orjson.dumps(record)
        for raw, escaped in _LINE_BREAKS:  # JSON allows them in a string; a reader splitting lines may not
            line = line.replace(raw, escaped)
        line += b"\n"
        if self.size + len(line) > MAX_BYTES > 0:
            self._rotate()
        self.file.write(line)
        self.size += len(line)

    def _rotate(self) -> None:
        self.file.close()
        for n in range(BACKUPS - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            if older.exists():
                older.replace(self.path.with_name(f"{self.path.name}.{n + 1}"))
        if BACKUPS:
            self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink(missing_ok=True)
        self.file = open(self.path, "ab", buffering=0)  # noqa: SIM115
        self.size = 0


_file: RequestFile | None = None


def request_file() -> RequestFile:
    """This replica's requests file, opened on first use."""
    global _file
    if _file is None:
        from ray import serve
        from ray.serve._private.logging_utils import get_serve_logs_dir

        ctx = serve.get_replica_context()
        name = f"requests_{ctx.app_name}_{ctx.deployment}_{ctx.replica_id.unique_id}.log"
        _file = RequestFile(Path(get_serve_logs_dir()) / name)
    return _file


def emit(summary: RequestSummary) -> None:
    request_file().write({"time": round(time.time(), 3), "beamserve": "request", **summary.fields()})
