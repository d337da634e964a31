"""Document throughput: Multi30k's test sentences (test_2016_flickr.en, four to a paragraph) as a plain
text, an HTML, a SubRip and a Word document, each uploaded to DeepL's /v2/document and timed to its status
`done`; beside it, the same paragraphs sent to /v1/translate, max_texts at a time, one request after
another (what a client that split the file itself would get), each side twice in turn and the faster
kept. One server, en-de, the translation cache off, on this machine's CPUs.

    python loadtests/bench_documents.py [--data ../shared/data/multi30k] [--compute-type int8]
"""

from __future__ import annotations

import argparse
import gzip
import html
import io
import os
import re
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtests.reports import emit
from service import runtime
from service.runtime import free_loopback_port
from service.settings import Settings


def documents(sentences: list[str]) -> dict[str, tuple[bytes, list[str]]]:
    """Each format's file, and its paragraphs as /v1 gets them."""
    paragraphs = [" ".join(sentences[i : i + 4]) for i in range(0, len(sentences), 4)]
    text = "\n\n".join(paragraphs) + "\n"
    marked = []  # each paragraph with its third word in bold, for the alignment to carry over
    for paragraph in paragraphs:
        words = [html.escape(w) for w in paragraph.split(" ")]
        words[2] = f"<b>{words[2]}</b>"
        marked.append(" ".join(words))
    page = "<html><body>" + "".join(f"<p>{p}</p>" for p in marked) + "</body></html>"
    cues = "".join(
        f"{i}\n00:{i // 60:02d}:{i % 60:02d},000 --> 00:{i // 60:02d}:{i % 60:02d},900\n{s}\n\n"
        for i, s in enumerate(sentences, 1)
    )
    return {
        "txt": (text.encode(), paragraphs),
        "html": (page.encode(), marked),
        "srt": (cues.encode(), sentences),
        "docx": word(paragraphs),
    }


def word(paragraphs: list[str]) -> tuple[bytes, list[str]]:
    """A Word file of the paragraphs, the third word of each in bold (python-docx, a dev dependency),
    and its paragraphs as /v1 gets them (HTML with the bold run marked)."""
    import docx

    from service.text import documents as formats

    d = docx.Document()
    for paragraph in paragraphs:
        words = paragraph.split(" ")
        p = d.add_paragraph(" ".join(words[:2]) + " ")
        p.add_run(words[2]).bold = True
        p.add_run(" " + " ".join(words[3:]))
    out = io.BytesIO()
    d.save(out)
    return out.getvalue(), formats.parse("bench.docx", out.getvalue()).segments


def upload(url: str, name: str, data: bytes) -> float:
    """Seconds from the upload to the status `done`."""
    start = time.perf_counter()
    r = httpx.post(
        f"{url}/v2/document", files={"file": (name, data)}, data={"target_lang": "DE", "source_lang": "EN"}, timeout=120
    )
    r.raise_for_status()
    handle = r.json()
    while True:
        status = httpx.post(
            f"{url}/v2/document/{handle['document_id']}", json={"document_key": handle["document_key"]}
        ).json()
        if status["status"] == "done":
            return time.perf_counter() - start
        if status["status"] == "error":
            raise RuntimeError(status)
        time.sleep(0.2)  # a client polling faster would take the CPU the translation needs


def on_v1(url: str, texts: list[str], html_mode: bool, step: int) -> float:
    start = time.perf_counter()
    for at in range(0, len(texts), step):
        body = {"texts": texts[at : at + step], "source": "en", "target": "de", "cache": False}
        if html_mode:
            body["tag_handling"] = "html"
        httpx.post(f"{url}/v1/translate", json=body, timeout=120).raise_for_status()
    return time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.environ.get("BEAMSERVE_DATA", "../shared/data/multi30k"))
    p.add_argument("--compute-type", default="default")
    p.add_argument("--out", type=Path, default=None, help="also write the report here (markdown)")
    args = p.parse_args()
    with gzip.open(Path(args.data) / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip()]
    settings = Settings(
        models="en-de",
        port=free_loopback_port(),
        metrics_port=free_loopback_port(),
        cache_entries=0,
        compute_type=args.compute_type,
        records_storage=f"sqlite:///{Path(os.environ.get('TMPDIR', '/tmp'))}/bench-documents-{os.getpid()}.sqlite3",
    )
    runtime.start(settings)
    url = f"http://127.0.0.1:{settings.port}"
    try:
        deadline = time.monotonic() + 120
        while httpx.get(f"{url}/readyz").status_code != 200:
            assert time.monotonic() < deadline, "not ready"
            time.sleep(0.5)
        on_v1(url, sentences[:64], False, settings.max_texts)  # warm the replica
        rows = [
            f"# Documents, en-de, {len(sentences)} sentences, compute type {args.compute_type}",
            "",
            "| format | characters | document: seconds | characters/s | /v1, the same paragraphs: seconds "
            "| speed against /v1 |",
            "|---|---|---|---|---|---|",
        ]
        for kind, (data, texts) in documents(sentences).items():
            print(f"{kind}: uploading {len(data)} bytes", flush=True)
            # Each twice, in turn, the faster of each kept: neither side pays for shapes the other warmed.
            took = direct = float("inf")
            for _ in range(2):
                direct = min(direct, on_v1(url, texts, kind in ("html", "docx"), settings.max_texts))
                took = min(took, upload(url, f"bench.{kind}", data))
            characters = sum(len(html.unescape(re.sub(r"<[^>]*>", "", t))) for t in texts)  # text, not markup
            speed = f"{characters / took:.0f} | {direct:.1f} | {direct / took:.2f}x"
            rows.append(f"| {kind} | {characters} | {took:.1f} | {speed} |")
        emit("\n".join(rows), args.out)
    finally:
        runtime.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
