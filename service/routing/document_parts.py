"""What a document keeps in the records store so that another gateway replica can go on with it: its upload, and
each chunk's translations as the chunk is done (service/routing/document_jobs.py), for KEEP_S, until it is
settled."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from service.engine import allocator
from service.schemas import TranslateRequest
from service.store.records import Records, StoreUnavailableError
from service.text import documents
from service.text.parsed import Parsed

SOURCE, PART = "document-source", "document-part"
KEEP_S = 3600.0  # as a document's status


async def keep_upload(records: Records, document_id: str, owner: str, data: bytes) -> None:
    await records.put(SOURCE, document_id, owner, data, ttl_s=KEEP_S)


async def save(records: Records, document_id: str, owner: str, at: int, texts: list[str]) -> None:
    """The translations of the chunk that starts at segment `at`."""
    await records.put(PART, f"{document_id}:{at}", owner, json.dumps(texts).encode(), ttl_s=KEEP_S)


async def saved(records: Records, document_id: str) -> list[str]:
    """The translations of the chunks saved so far, in order (none for a new document)."""
    out: list[str] = []
    while (part := await records.get(PART, f"{document_id}:{len(out)}")) is not None:
        out += json.loads(part.body)
    return out


async def upload_of(
    records: Records, document_id: str, filename: str, request: dict[str, Any]
) -> tuple[Parsed, TranslateRequest]:
    """The document parsed again from its upload, and its request; LookupError where the upload is gone (expired,
    or a document from before uploads were kept)."""
    source = await records.get(SOURCE, document_id)
    if source is None or not request:
        raise LookupError("its upload is no longer kept")
    parsed = await asyncio.to_thread(allocator.released, documents.parse, filename, source.body)
    return parsed, TranslateRequest.model_validate({**request, "texts": parsed.segments[:1] or ["-"]})


async def forget(records: Records, document_id: str, segments: int, step: int) -> None:
    """The upload and its chunks (`segments` translated, `step` a chunk), once the document is settled."""
    with contextlib.suppress(StoreUnavailableError):
        await records.delete(SOURCE, document_id)
        for at in range(0, segments, step):
            await records.delete(PART, f"{document_id}:{at}")
