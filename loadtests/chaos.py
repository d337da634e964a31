"""Chaos run: the production Serve config on the loopback multi-node cluster (loadtests/cluster.py) under
mixed load while, in turn, the batching knobs are changed live, a Gateway replica, a worker node and a model
replica are SIGKILLed, and the records store and the head are restarted (GCS fault tolerance), each
--rounds times.

    python loadtests/chaos.py --out loadtests/results/chaos.md     # 20 minutes, every fault twice
    python loadtests/chaos.py --minutes 1 --rounds 1               # make test's version (tests/test_chaos.py)
    python loadtests/chaos.py --minutes 1 --rounds 1 --keep-logs /tmp/chaos-logs   # the nodes' logs kept

Every request carries an X-Request-ID of its own, so a request that got no HTTP answer is looked up in the
requests logs at the end: whether a gateway replica answered it, HAProxy recorded it (its status and its
termination state), or neither did.

The app has API keys (one for the texts and glossaries, one for each document) counted in the records store,
a Redis server with an append-only file as the RayService's base deploys Valkey. First the front's checks
(cluster_faults.case_front: HAProxy's JSON 413, a JSON 404, loopback listeners, the requests log), then a
5 MB Word file (paragraphs and an incompressible picture) through the deepl client: uploaded to one Gateway
replica and downloaded through another (each replica's requests log says which). Then the load:
- texts at --rate a second, in turn: /v1 plain and HTML, DeepL's /v2/translate with a glossary (its term
  must be in the answer), LibreTranslate's /translate with HTML;
- a glossary made every GLOSSARY_EVERY_S (DeepL's /v2/glossaries), used by the texts from then on;
- a document uploaded every DOCUMENT_EVERY_S (.txt or .docx of Multi30k's test sentences), its status
  followed to the end and its translation downloaded.
The faults, evenly spaced: `serve deploy` with other batching knobs (the model replicas must keep their
processes and answer with the new knobs), a Gateway or model replica SIGKILLed (Serve starts another), a
worker node SIGKILLed (raylet, agents, workers) and started again 5 s later as Kubernetes restarts a pod,
the records store SIGTERMed and started on its file again, every process of the head SIGKILLed and `ray
start` again. The run fails (exit 1) unless:
- no 5xx answer is anything but beamserve's JSON error, none is a 500, and no connection goes unanswered
  but the head's: refused while the head is down, or closed when it died (the front runs on the head here);
- every accepted document ends done (its translation downloaded, one line for each line it had) or failed,
  and its key was billed its billed_characters (done) or nothing (failed): never twice, never for a failure;
- every glossary made is there at the end with its entries;
- after each fault, the texts answer 200 again within RECOVERY_S: its disruption (the failed text requests
  from the fault on, each within QUIET_S of the last) ends less than RECOVERY_S after it. A failure after
  QUIET_S of 200s is a stray one (a refusal as overloaded under the documents' load, say), not the fault's
  recovery: reported with its code, and held to the same checks as every answer.
Documents on a killed Gateway are taken over once their status lapses (document_jobs.STALE_S), so the run
follows them up to that long past the load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import hashlib
import io
import json
import os
import random
import secrets
import signal
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cluster
from cluster_faults import RETUNED, case_front, knobs_served, retuned
from faults import check, summarise
from reports import recorded

RECOVERY_S = 30.0
LOGGED_S = 5.0  # a request's line reaches its replica's requests log within this
QUIET_S = 10.0  # a fault's disruption ends at its last failure followed by this long of 200s alone
STALE_S = 60.0  # service/routing/document_jobs.py: a document's status lapses this long after its replica died
GLOSSARY_EVERY_S = 15.0
DOCUMENT_EVERY_S = 6.0
FAULTS = ("reconfigure", "gateway-kill", "node-kill", "model-kill", "records-restart", "head-restart")
TEXT_KEY = "chaos-texts"
WORD_KEY = "chaos-word"
TERMS = ("Köter", "Hündchen", "Wauwau", "Fiffi")
TEXTS = ("v1", "v1-html", "deepl-glossary", "libre-html")


def sentences() -> list[str]:
    """Multi30k's test sentences (the slice that ships in tests/data)."""
    with gzip.open(cluster.REPO / "tests" / "data" / "multi30k" / "test_2016_flickr.en.gz", "rt") as f:
        return [line.strip() for line in f if line.strip()]


SENTENCES = sentences()


def client_id(key: str) -> str:
    """The id a key's requests are logged under (service/api/keys.py: `key-` and its SHA-256's start)."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def document_key(i: int) -> str:
    return f"chaos-document-{i:04d}"


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"DeepL-Auth-Key {key}"}


@dataclass
class Answer:
    kind: str
    sent: float  # seconds since the load began
    status: int  # 0: no HTTP answer
    body: str = ""  # when not 200
    error: str = ""  # the exception when there was no answer
    ended: float = 0.0  # when the answer (or the exception) came, seconds since the load began
    request_id: str = ""  # the X-Request-ID it was sent with: the front's log line for it is found by this


@dataclass
class Document:
    i: int
    name: str
    lines: int
    accepted: bool = False
    outcome: str = ""  # done, error, or what it was at the end
    billed: int = 0  # billed_characters of a done document
    used: int | None = None  # the key's usage at the end
    downloaded: bool = False
    note: str = ""


@dataclass
class Fault:
    kind: str
    at: float  # seconds since the load began
    took: float = 0.0  # seconds the action itself took
    detail: str = ""


@dataclass
class Run:
    start: float = field(default_factory=time.monotonic)
    answers: list[Answer] = field(default_factory=list)
    documents: list[Document] = field(default_factory=list)
    glossaries: dict[str, str] = field(default_factory=dict)  # glossary id -> its entries
    faults: list[Fault] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)  # 200s whose content is not what was asked

    def now(self) -> float:
        return time.monotonic() - self.start


def json_error(body: str) -> bool:
    """beamserve's error body on each API: /v1's {error, request_id}, DeepL's {message, code, request_id},
    LibreTranslate's {error}."""
    try:
        answer = json.loads(body)
    except ValueError:
        return False
    return isinstance(answer, dict) and bool(answer.get("error") or answer.get("message"))


def codes(answers: list[Answer]) -> dict[str, int]:
    """How many answers of each status and error code (or exception, where there was no answer)."""
    return dict(Counter(f"{a.status} {error_code(a.body)}".strip() if a.status else a.error for a in answers))


def error_code(body: str) -> str:
    try:
        answer = json.loads(body)
    except ValueError:
        return "not JSON"
    return str(answer.get("error") or answer.get("code") or "") if isinstance(answer, dict) else "not JSON"


async def call(
    run: Run, http: httpx.AsyncClient, kind: str, method: str, path: str, **kw: Any
) -> httpx.Response | None:
    sent, rid = run.now(), f"chaos-{secrets.token_hex(8)}"
    kw["headers"] = {**kw.get("headers", {}), "x-request-id": rid}
    try:
        r = await http.request(method, path, **kw)
    except httpx.HTTPError as exc:
        run.answers.append(Answer(kind, sent, 0, error=type(exc).__name__, ended=run.now(), request_id=rid))
        return None
    body = "" if r.status_code == 200 else r.text[:300]
    run.answers.append(Answer(kind, sent, r.status_code, body, run.now(), rid))
    return r


async def text(run: Run, http: httpx.AsyncClient, i: int) -> None:
    kind = TEXTS[i % len(TEXTS)]
    sentence = SENTENCES[i % len(SENTENCES)]
    if kind == "v1":
        body = {"texts": [sentence], "source": "en", "target": "de", "cache": False}
        r = await call(run, http, kind, "POST", "/v1/translate", json=body, headers=auth(TEXT_KEY))
        if r is not None and r.status_code == 200 and not r.json()["translations"][0]["text"]:
            run.wrong.append(f"{kind}: an empty translation")
    elif kind == "v1-html":
        body = {"texts": [f"<p>{sentence} <b>Now.</b></p>"], "source": "en", "target": "de", "tag_handling": "html"}
        body["cache"] = False
        r = await call(run, http, kind, "POST", "/v1/translate", json=body, headers=auth(TEXT_KEY))
        if r is not None and r.status_code == 200 and "<b>" not in r.json()["translations"][0]["text"]:
            run.wrong.append(f"{kind}: the markup lost")
    elif kind == "deepl-glossary" and run.glossaries:
        gid = list(run.glossaries)[i % len(run.glossaries)]
        term = run.glossaries[gid].split("\t")[1]
        body = {"text": ["A dog is running in the snow."], "source_lang": "EN", "target_lang": "DE", "glossary_id": gid}
        r = await call(run, http, kind, "POST", "/v2/translate", json=body, headers=auth(TEXT_KEY))
        if r is not None and r.status_code == 200 and term not in r.json()["translations"][0]["text"]:
            run.wrong.append(f"{kind}: {term!r} not in {r.json()['translations'][0]['text']!r}")
    else:
        body = {"q": f"<p>{sentence}</p>", "source": "en", "target": "de", "format": "html", "api_key": TEXT_KEY}
        await call(run, http, "libre-html", "POST", "/translate", json=body)


async def glossary(run: Run, http: httpx.AsyncClient, i: int) -> None:
    entries = f"dog\t{TERMS[i % len(TERMS)]}"
    body = {"name": f"chaos-{i}", "source_lang": "en", "target_lang": "de", "entries": entries, "entries_format": "tsv"}
    r = await call(run, http, "glossary-make", "POST", "/v2/glossaries", json=body, headers=auth(TEXT_KEY))
    if r is not None and r.status_code in (200, 201):
        run.glossaries[r.json()["glossary_id"]] = entries


def text_file(i: int) -> tuple[str, bytes, int]:
    lines = [SENTENCES[(i * 7 + k) % len(SENTENCES)] for k in range(6 + i % 7)]
    return f"chaos-{i}.txt", ("\n".join(lines) + "\n").encode(), len(lines)


def word_file(paragraphs: list[str], picture_bytes: int = 0) -> bytes:
    """A Word file of the paragraphs (python-docx), with a PNG of random pixels of about picture_bytes."""
    import docx

    d = docx.Document()
    for p in paragraphs:
        d.add_paragraph(p)
    if picture_bytes:
        d.add_picture(io.BytesIO(noise_png(picture_bytes)))
    out = io.BytesIO()
    d.save(out)
    return out.getvalue()


def noise_png(size: int) -> bytes:
    """A valid PNG of random grey pixels, about `size` bytes (random pixels do not compress)."""
    side = int(size**0.5)
    rng = random.Random(0)
    raw = b"".join(b"\x00" + rng.randbytes(side) for _ in range(side))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")

    header = side.to_bytes(4, "big") * 2 + bytes([8, 0, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 1)) + chunk(b"IEND", b"")


async def document(run: Run, http: httpx.AsyncClient, i: int, settle_by: list[float]) -> None:
    if i % 3 == 2:
        lines = [SENTENCES[(i * 5 + k) % len(SENTENCES)] for k in range(8)]
        name, data, count = f"chaos-{i}.docx", word_file(lines), len(lines)
    else:
        name, data, count = text_file(i)
    doc = Document(i, name, count)
    run.documents.append(doc)
    key = auth(document_key(i))
    files = {"file": (name, data)}
    form = {"source_lang": "EN", "target_lang": "DE"}
    r = await call(run, http, "document-upload", "POST", "/v2/document", files=files, data=form, headers=key)
    if r is None or r.status_code != 200:
        doc.outcome = f"not accepted ({r.status_code if r is not None else 'no answer'})"
        return
    doc.accepted = True
    handle = r.json()
    path, form = f"/v2/document/{handle['document_id']}", {"document_key": handle["document_key"]}
    while run.now() < settle_by[0]:
        s = await call(run, http, "document-status", "POST", path, data=form, headers=key)
        if s is not None and s.status_code == 200:
            doc.outcome = s.json()["status"]
            if doc.outcome in ("done", "error"):
                doc.billed = int(s.json().get("billed_characters", 0))
                doc.note = s.json().get("error_message", "")
                break
        elif s is not None and s.status_code not in (503, 504):
            doc.outcome = f"status answered {s.status_code}"
            return
        await asyncio.sleep(1.0)
    while doc.outcome == "done" and run.now() < settle_by[0]:
        d = await call(run, http, "document-download", "POST", f"{path}/result", data=form, headers=key)
        if d is not None and d.status_code == 200:
            doc.downloaded = True
            got = translated_lines(name, d.content)
            if len(got) != count or any(not line for line in got):
                run.wrong.append(f"{name}: {len(got)} lines translated of {count}")
            break
        await asyncio.sleep(1.0)


def translated_lines(name: str, data: bytes) -> list[str]:
    if name.endswith(".docx"):
        import docx

        return [p.text for p in docx.Document(io.BytesIO(data)).paragraphs if p.text.strip()]
    return data.decode().strip().split("\n")


async def load(run: Run, url: str, seconds: float, rate: float) -> None:
    """Texts, glossaries and documents for `seconds`, then the documents followed until they settle."""
    limits = httpx.Limits(max_keepalive_connections=0)  # a connection each: independent clients
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        tasks: list[asyncio.Task[None]] = []
        settle_by = [seconds + STALE_S + 90.0]
        made = documents = i = 0
        while (now := run.now()) < seconds:
            if now >= made * GLOSSARY_EVERY_S:
                tasks.append(asyncio.create_task(glossary(run, http, made)))
                made += 1
            if now >= documents * DOCUMENT_EVERY_S:
                tasks.append(asyncio.create_task(document(run, http, documents, settle_by)))
                documents += 1
            tasks.append(asyncio.create_task(text(run, http, i)))
            i += 1
            await asyncio.sleep(max(0.0, i / rate - run.now()))
        await asyncio.gather(*tasks)
        await usage_and_glossaries(run, http)


async def usage_and_glossaries(run: Run, http: httpx.AsyncClient) -> None:
    """Each document key's usage, and each glossary's entries, asked until answered (the store may be back
    only now)."""

    async def asked(kind: str, path: str, key: str) -> httpx.Response | None:
        for _ in range(30):
            r = await call(run, http, kind, "GET", path, headers=auth(key))
            if r is not None and r.status_code not in (503, 504):
                return r
            await asyncio.sleep(1.0)
        return None

    for doc in run.documents:
        r = await asked("usage", "/v2/usage", document_key(doc.i))
        doc.used = int(r.json()["character_count"]) if r is not None and r.status_code == 200 else None
    kept = {}
    for gid in run.glossaries:
        r = await asked("glossary-read", f"/v2/glossaries/{gid}/entries", TEXT_KEY)
        kept[gid] = r.text.strip() if r is not None and r.status_code == 200 else None
    run.wrong += [
        f"glossary {gid}: {got!r}, not {run.glossaries[gid]!r}"
        for gid, got in kept.items()
        if got != run.glossaries[gid]
    ]


def inject(
    c: cluster.Cluster, run: Run, kinds: list[str], seconds: float, config: dict[str, Any], failures: list[str]
) -> None:
    """The faults, evenly spaced over the load, one after another (a thread: each blocks)."""
    rng = random.Random(1)
    knobs = [RETUNED, {k: config["applications"][0]["deployments"][0]["user_config"][k] for k in RETUNED}]
    for k, kind in enumerate(kinds):
        at = seconds * (k + 1) / (len(kinds) + 1)
        time.sleep(max(0.0, at - run.now()))
        fault = Fault(kind, run.now())
        t = time.monotonic()
        if kind == "reconfigure":  # a live change of the batching knobs, back again the next time
            before = {pid for d, _, pid in c.replicas() if d.startswith("model-")}
            wanted = knobs[sum(f.kind == kind for f in run.faults) % 2]
            c.deploy(retuned(config, wanted))
            same = {pid for d, _, pid in c.replicas() if d.startswith("model-")} == before
            check(same, "reconfigure: the model replicas reconfigured in place (same processes)", failures)
            check(knobs_served(c.url, wanted, auth(TEXT_KEY)), f"reconfigure: {wanted} in /v1/stats", failures)
            fault.detail = f"{wanted}"
        elif kind == "node-kill":
            live = [n for n in c.nodes if n.name != "head"]
            where = Counter(node for _, node, _ in c.replicas() if node != "head")
            victim = max(live, key=lambda n: where[n.name]).name
            c.kill_node(victim)
            time.sleep(5.0)
            c.add_worker(int(victim.removeprefix("node-")))
            fault.detail = f"{victim} with {where[victim]} replicas, started again"
        elif kind in ("gateway-kill", "model-kill"):
            replicas = [(d, n, pid) for d, n, pid in c.replicas() if (d == "Gateway") == (kind == "gateway-kill")]
            d, node, pid = rng.choice(replicas)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            fault.detail = f"{d} on {node}"
        elif kind == "head-restart":
            c.restart_head()
        elif kind == "records-restart":
            fault.detail = f"down {c.restart_records():.1f} s"
        fault.took = time.monotonic() - t
        run.faults.append(fault)


def word_across_gateways(c: cluster.Cluster, failures: list[str]) -> None:
    """A 5 MB Word file through the deepl client, uploaded to one Gateway replica and downloaded through
    another: the document's records are the cluster's, not a replica's."""
    import deepl

    paragraphs = SENTENCES[:40]
    data = word_file(paragraphs, 5_000_000)
    translator = deepl.Translator(WORD_KEY, server_url=c.url)
    t = time.monotonic()
    handle = translator.translate_document_upload(data, target_lang="DE", source_lang="EN", filename="report.docx")
    uploaded = set(replicas_logging(c, "/v2/document", 1))
    translator.translate_document_wait_until_done(handle)
    downloaded: set[str] = set()
    out = b""
    for k in range(1, 17):  # Serve picks the replica: until a download has gone through another
        buffer = io.BytesIO()
        translator.translate_document_download(handle, buffer)
        out = buffer.getvalue()
        downloaded = set(replicas_logging(c, "/v2/document/{document_id}/result", k))
        if downloaded - uploaded:
            break
    took = time.monotonic() - t
    got = translated_lines("report.docx", out)
    picture = next(iter(n for n in zipfile_names(out) if n.startswith("word/media/")), "")
    print(
        f"word: {len(data) / 1e6:.1f} MB uploaded to {sorted(uploaded)}, downloaded through {sorted(downloaded)}"
        f" ({len(out) / 1e6:.1f} MB) in {took:.1f} s",
        flush=True,
    )
    check(len(data) >= 5_000_000, "word: the file is 5 MB or more", failures)
    check(
        len(uploaded) == 1 and bool(downloaded - uploaded), "word: downloaded through another Gateway replica", failures
    )
    same_picture = bool(picture) and zipfile_member(out, picture) == zipfile_member(data, picture)
    check(len(got) == len(paragraphs) and same_picture, "word: every paragraph translated, the picture kept", failures)


def zipfile_names(data: bytes) -> list[str]:
    import zipfile

    return zipfile.ZipFile(io.BytesIO(data)).namelist()


def zipfile_member(data: bytes, name: str) -> bytes:
    import zipfile

    return zipfile.ZipFile(io.BytesIO(data)).read(name)


def replicas_logging(c: cluster.Cluster, route: str, lines: int) -> Counter[str]:
    """The Word key's lines on `route` in each Gateway replica's requests log (its file names the replica), read
    again until there are `lines` of them or for LOGGED_S (a request's line is written as its answer goes)."""
    deadline = time.monotonic() + LOGGED_S
    while sum((found := logged(c, route)).values()) < lines and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def logged(c: cluster.Cluster, route: str) -> Counter[str]:
    found: Counter[str] = Counter()
    for name, entry in request_lines(c, "Gateway"):
        if entry.get("client") == client_id(WORD_KEY) and entry.get("route") == route:
            found[name.rsplit("_", 1)[-1]] += 1
    return found


def request_lines(c: cluster.Cluster, writer: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(the file's name, the line) of every line in the requests logs whose file names `writer` (a Gateway
    replica's, HAProxy's; all where empty); a line a killed process left cut is not JSON and is passed over."""
    name = f"requests_*{writer}*.log" if writer else "requests_*.log"
    for path in Path(c.temp_dir).glob(f"session_*/logs/serve/{name}"):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                yield path.stem, json.loads(line)


def front_records(c: cluster.Cluster) -> dict[str, dict[str, Any]]:
    """Every request's line in the requests logs, by request id: a gateway replica's for those it answered,
    HAProxy's for the rest (service/api/front_log.py)."""
    return {str(entry.get("request_id", "")): entry | {"file": name} for name, entry in request_lines(c)}


def print_front_records(c: cluster.Cluster, unanswered: list[Answer]) -> None:
    """What the front recorded of each request that got no HTTP answer: its status and termination state
    (HAProxy's two letters: which side ended the connection, and at which phase), or that it recorded nothing."""
    if not unanswered:
        return
    records = front_records(c)
    seen: Counter[str] = Counter()
    for a in unanswered:
        r = records.get(a.request_id)
        by = "haproxy" if r and "haproxy" in r["file"] else "a gateway"
        seen[f"{a.error}: " + (f"{by} {r.get('status')} {r.get('termination', '')}" if r else "no line")] += 1
    print(f"the front's records of the {len(unanswered)} requests without an answer: {dict(seen.most_common())}")


def verdict(run: Run, seconds: float, failures: list[str]) -> None:
    by_kind: dict[str, Counter[str]] = {}
    for a in run.answers:
        by_kind.setdefault(a.kind, Counter())[str(a.status) if a.status else f"no answer ({a.error})"] += 1
    print("answers by kind and status:")
    for kind, counts in sorted(by_kind.items()):
        print(f"  {kind}: {dict(sorted(counts.items()))}")
    print("faults (seconds into the load; recovery: to the end of the failures in its wake):")
    recoveries = []
    for k, f in enumerate(run.faults):
        until = run.faults[k + 1].at if k + 1 < len(run.faults) else seconds
        # The failures in a fault's wake may run on past the next fault: its recovery is not cut off there.
        failed = sorted(
            (a for a in run.answers if a.kind in TEXTS and f.at <= a.sent and a.status != 200), key=lambda a: a.sent
        )
        recovery, end = 0.0, f.at
        for a in failed:
            if a.sent - end > QUIET_S:
                break
            recovery, end = a.sent - f.at, a.sent
        ours = [a for a in failed if a.sent < until and a.sent <= end]
        stray = [a for a in failed if end < a.sent < until]
        recoveries.append(recovery)
        detail = f" ({f.detail})" if f.detail else ""
        said = f"took {f.took:.1f} s, failed {codes(ours) or 0}, recovered {recovery:.1f} s"
        said += (
            f"; later, apart from it: {codes(stray)} at {', '.join(f'{a.sent:.0f}' for a in stray)} s" if stray else ""
        )
        print(f"  {f.at:6.1f} s {f.kind}{detail}: {said}")
    # The front runs on the head here: a connection refused while the head is down, or one it held when it
    # died (sent before, closed as the head's processes were killed), is the head's.
    head_down = [(f.at, f.at + f.took + RECOVERY_S) for f in run.faults if f.kind == "head-restart"]
    unanswered = [
        a for a in run.answers if a.status == 0 and not any(s <= a.sent <= e or s <= a.ended <= e for s, e in head_down)
    ]
    bad = [a for a in run.answers if a.status == 500 or (a.status >= 500 and not json_error(a.body))]
    for a in (bad + unanswered)[:5]:
        print(f"  e.g. {a.kind} at {a.sent:.1f} s: {a.status or a.error} {a.body[:160]}")
    check(not bad, f"no 500 and no 5xx but beamserve's JSON errors ({len(bad)})", failures)
    check(not unanswered, f"no connection unanswered but while the head was down ({len(unanswered)})", failures)
    accepted = [d for d in run.documents if d.accepted]
    outcomes = Counter(d.outcome for d in run.documents)
    print(f"documents: {len(run.documents)} uploaded, {len(accepted)} accepted, outcomes {dict(outcomes)}")
    for d in run.documents:
        if d.outcome not in ("done",) or d.used != d.billed:
            print(f"  {d.name}: {d.outcome}, billed {d.billed}, the key used {d.used} {d.note[:80]}")
    unsettled = [d.name for d in accepted if d.outcome not in ("done", "error")]
    check(not unsettled, f"every accepted document done or failed ({len(unsettled)} not)", failures)
    check(all(d.downloaded for d in accepted if d.outcome == "done"), "every done document downloaded", failures)
    billed_wrong = [d.name for d in run.documents if d.used != (d.billed if d.outcome == "done" else 0)]
    check(
        not billed_wrong, f"each document's key billed once for a done one, nothing else ({billed_wrong[:5]})", failures
    )
    print(f"glossaries: {len(run.glossaries)} made")
    for w in run.wrong[:5]:
        print(f"  wrong: {w}")
    check(not run.wrong, f"every 200 is what was asked; every glossary kept ({len(run.wrong)} not)", failures)
    slow = [f"{f.kind} {r:.1f} s" for f, r in zip(run.faults, recoveries, strict=True) if r >= RECOVERY_S]
    check(not slow, f"every recovery under {RECOVERY_S:.0f} s ({slow})", failures)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=20.0, help="minutes of load")
    p.add_argument("--rounds", type=int, default=2, help="times each fault happens")
    p.add_argument("--rate", type=float, default=3.0, help="text requests a second")
    p.add_argument("--out", type=Path, help="also write the run's output as a report here")
    p.add_argument("--keep-logs", type=Path, help="copy the nodes' Ray and Serve logs into this folder at the end")
    args = p.parse_args()
    cluster.isolate()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with recorded("# Chaos run", args.out):
        failed = chaos(args)
    return 1 if failed else 0


def chaos(args: argparse.Namespace) -> bool:
    failures: list[str] = []
    seconds = args.minutes * 60
    documents = int(seconds / DOCUMENT_EVERY_S) + 2
    keys = [TEXT_KEY, WORD_KEY, *(document_key(i) for i in range(documents))]
    config = cluster.serve_config(
        args={"api_keys": ",".join(keys), "limits_storage": f"redis://127.0.0.1:{cluster.RECORDS_PORT}/1"}
    )
    start = time.monotonic()
    with cluster.Cluster(workers=2, worker_cpus=3, gcs_store=True, keep_logs=args.keep_logs) as c:
        c.deploy(config)
        print(f"cluster of {len(c.nodes)} nodes running the app in {time.monotonic() - start:.1f} s", flush=True)
        case_front(c, failures, auth(TEXT_KEY))
        word_across_gateways(c, failures)
        kinds = [k for _ in range(args.rounds) for k in FAULTS]
        print(f"load: {args.minutes:g} min, {args.rate:g} texts/s; faults: {', '.join(kinds)}", flush=True)
        run = Run()
        faults = threading.Thread(target=inject, args=(c, run, kinds, seconds, config, failures), daemon=True)
        faults.start()
        asyncio.run(load(run, c.url, seconds, args.rate))
        faults.join()
        verdict(run, seconds, failures)
        print_front_records(c, [a for a in run.answers if a.status == 0])
        done = [f.kind for f in run.faults]
        check(done == kinds, f"every fault made ({len(done)} of {len(kinds)})", failures)
    summarise(failures)
    return bool(failures)


if __name__ == "__main__":
    raise SystemExit(main())
