"""One summary line per HTTP request, through Serve's logger: with `logging_config: {encoding: JSON}`
(the default of `beamserve serve` and the Serve config) each is a JSON object in the gateway
replica's log file, beside Serve's own access lines. What it holds is counts and times, never a
text: request_id, route, method, status, pair, texts, characters, sentences, cached_sentences
(answered without decoding: from the cache, or a repeat within the request), queue_wait_s (the
longest any of its sentences waited to start decoding), decode_s (the longest a replica call spent
from the first of its sentences starting to the last finishing), duration_s, client (the API key's
name; "anonymous" while keys are off).

The ingress middleware opens a summary for each request (a context variable, which the tasks a
request spawns share); the routes and the pair router add to it as they learn.
"""

import contextvars
import logging
from dataclasses import asdict, dataclass, field
from typing import Any

# Serve's own logger: inside a replica its handlers write the configured encoding to the replica's
# log file (and stderr); a line through another logger would only reach the worker's raw stderr.
logger = logging.getLogger("ray.serve")


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
        out = asdict(self)
        out["pair"] = ",".join(out.pop("pairs"))
        out["queue_wait_s"] = round(self.queue_wait_s, 4)
        out["decode_s"] = round(self.decode_s, 4)
        out["duration_s"] = round(self.duration_s, 4)
        return out


_current: contextvars.ContextVar[RequestSummary | None] = contextvars.ContextVar("beamserve_request", default=None)


def start(request_id: str, route: str, method: str) -> RequestSummary:
    summary = RequestSummary(request_id, route, method)
    _current.set(summary)
    return summary


def current() -> RequestSummary:
    """The summary of the request being answered; a detached one outside a request (nothing logs it)."""
    return _current.get() or RequestSummary("", "", "")


def emit(summary: RequestSummary) -> None:
    # The fields go as the record's extras: Serve's JSON formatter writes each as a key of the line.
    fields = summary.fields()
    logger.info(
        "%s %s %d %s texts=%d chars=%d sentences=%d %.3fs",
        summary.method,
        summary.route,
        summary.status,
        fields["pair"] or "-",
        summary.texts,
        summary.characters,
        summary.sentences,
        summary.duration_s,
        extra={"beamserve": "request", **fields},
    )
