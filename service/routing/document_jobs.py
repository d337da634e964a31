"""Document translations (DeepL's /v2/document): upload, status, download.

The gateway replica that takes an upload parses it (service/text/documents.py), keeps its status as a
record (service/store/records.py, so any replica answers for it) and translates its segments in the
background, MAX_TEXTS at a time through the same router, cache and batching engine as a request's
texts. The upload is answered once the document is done or after UPLOAD_WAIT_S, whichever is
first: a small document is ready when its client first asks. The status and the translated file
are readable with the document's key, by the API key that uploaded it, for KEEP_S.

A document outlives the replica translating it: its upload and each chunk's translations are records too, so
when its status has not been renewed for STALE_S (the replica died), or at once when the replica stops
gracefully (Serve calls the Gateway's __del__: its documents are handed over), the first replica to read its
status takes it over (a claim per lapsed status) and goes on from the last chunk saved.

A document is settled once, by whichever comes first (a claim in the shared store): a replica finishing
it (billed), its translation failing or being given up (refunded), or, where it cannot be taken over (its
upload expired, its glossary or memory deleted), the first replica to read its status after STALE_S (refunded to the
key that uploaded it): never billed for a result it did not get, never refunded twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from service.engine import allocator
from service.error_codes import RETRY_AFTER_S
from service.errors import ApiError, api_error, retry_after
from service.routing import document_parts
from service.routing.document_queue import DocumentQueue
from service.routing.pair_router import PairRouter
from service.schemas import TranslateRequest, Translation
from service.store.records import Records, StoreUnavailableError
from service.text.documents import FORMATS, extension
from service.text.glossary import Terms
from service.text.memory import Recall
from service.text.parsed import Parsed

logger = logging.getLogger(__name__)
KIND, RESULT, SETTLED = "document", "document-result", "document-settled"
LEASE = "document-lease"  # a claim per lapsed status: the replica that takes the document over
KEEP_S = 3600.0  # a document and its translation are kept this long after the upload
STALE_S = 60.0  # a translating document whose status is not renewed for this long has failed
UPLOAD_WAIT_S = 1.0
# Documents a gateway replica translates at once; the rest wait "queued", in the order they came, their status
# renewed and saying their place, so a folder uploaded at once does not fill the pair's queue and have its
# documents refused. At most WAITING of them wait on a replica, WAITING_PER_KEY of one key's: past that an
# upload is refused at once (503 `overloaded`, 429 on DeepL's route), before it is parsed or billed.
TRANSLATING_AT_ONCE = 2
WAITING = 64
WAITING_PER_KEY = 32
# A chunk refused for a passing reason (a full queue, a replica restarting, a model loading) is sent again
# after its Retry-After (at most RETRY_WAIT_S), for up to REFUSED_FOR_S of refusals in a row.
PASSING = {"overloaded", "replica_unavailable", "pair_unavailable", "timeout"}
RETRY_WAIT_S = 5.0
REFUSED_FOR_S = 300.0
ABANDONED = "the server translating it stopped; upload it again"
MAX_SUGGESTIONS = 100  # a document's memory suggestions its status holds


@dataclass(frozen=True)
class DocumentStatus:
    """A document's record: what DeepL's status route answers, and what the server needs besides."""

    document_id: str
    key_digest: str
    owner: str
    filename: str
    content_type: str
    characters: int
    status: str = "queued"  # queued, translating, done, error
    queue_position: int = 0  # while queued: 1 for the next to translate on the replica that took it
    done_segments: int = 0
    segments: int = 0
    started: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    error_message: str = ""
    request: dict[str, Any] = field(default_factory=dict)  # the TranslateRequest's fields set, but its texts
    # With a translation memory: the sentences its units answered, and the first MAX_SUGGESTIONS units near a
    # sentence that did not answer it ({segment, source, target, match}), offered to edit.
    memory_sentences: int = 0
    memory_suggestions: list[dict[str, Any]] = field(default_factory=list)

    def stale(self) -> bool:
        """Still queued or translating, its status not renewed for STALE_S: its replica stopped."""
        return self.status in ("queued", "translating") and time.time() - self.updated > STALE_S

    def answer(self) -> dict[str, Any]:
        """DeepL's status body: seconds_remaining while translating, billed_characters once done."""
        status = "error" if self.stale() else self.status
        out: dict[str, Any] = {"document_id": self.document_id, "status": status}
        if status == "queued" and self.queue_position:
            out["queue_position"] = self.queue_position
        if status == "translating":
            spent = max(time.time() - self.started, 0.001)
            rate = self.done_segments / spent
            out["seconds_remaining"] = round((self.segments - self.done_segments) / rate) if rate else None
        if status == "done":
            out["billed_characters"] = self.characters
        if self.request.get("memory") is not None:  # beamserve's: what the memory answered and offered
            out["memory_sentences"] = self.memory_sentences
            out["memory_suggestions"] = self.memory_suggestions
        if status == "error":
            out["error_message"] = self.error_message or ABANDONED
        return out


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class Job:
    """What a document is translated with: its request (languages, options, the glossary's and memory's ids), the
    glossary's terms and the memory's index, as its owner has them."""

    req: TranslateRequest
    terms: Terms | None = None
    recall: Recall | None = None


class DocumentJobs:
    def __init__(
        self,
        records: Records,
        router: PairRouter,
        refund_owner: Callable[[str, int], Awaitable[None]],
        job_of: Callable[[TranslateRequest, str], Awaitable[Job]],
    ) -> None:
        """refund_owner(owner, characters): give back what the key that uploaded a document was charged;
        job_of(req, owner): the request with its glossary and memory as its owner has them (a document taken over)."""
        self.records = records
        self.router = router
        self.refund_owner = refund_owner
        self.job_of = job_of
        self._stopping = False  # the replica stops: running documents are handed over, not failed
        self._running: dict[str, asyncio.Task[None]] = {}  # document id -> its translation
        self.queue = DocumentQueue(
            TRANSLATING_AT_ONCE, WAITING, WAITING_PER_KEY, self._say_place, STALE_S / 4, RETRY_WAIT_S
        )
        self._queued: dict[str, DocumentStatus] = {}  # the status of each document waiting for a place

    async def upload(
        self,
        parsed: Parsed,
        data: bytes,
        filename: str,
        job: Job,
        owner: str,
        refund: Callable[[], Awaitable[None]],
        wait_s: float = UPLOAD_WAIT_S,
    ) -> dict[str, str]:
        """Start translating a parsed document (its upload `data`, kept for a replica that takes it over);
        DeepL's {document_id, document_key}, once it is done or after wait_s. A document that fails is refunded
        its characters."""
        too_long = next(
            (i for i, s in enumerate(parsed.segments) if len(s) > self.router.settings.max_text_chars), None
        )
        if too_long is not None:
            raise ApiError(
                "document_too_large",
                f"paragraph {too_long + 1} has {len(parsed.segments[too_long])} characters; the server translates "
                f"at most {self.router.settings.max_text_chars} at once",
            )
        self.queue.room_for(owner)  # again: the parse let others in
        key = secrets.token_hex(24)
        status = DocumentStatus(
            str(uuid.uuid4()).replace("-", "").upper(),
            _digest(key),
            owner,
            filename,
            FORMATS[extension(filename)],
            parsed.characters,
            segments=len(parsed.segments),
            request=job.req.model_dump(mode="json", exclude={"texts"}, exclude_unset=True),
        )
        self.queue.accept(status.document_id, owner)  # counted from here, no await since the check
        try:
            await document_parts.keep_upload(self.records, status.document_id, owner, data)
            await self._save(status)
        except BaseException:
            self.queue.forget(status.document_id)
            raise
        task = self._start(status, parsed, job, refund)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), wait_s)
        return {"document_id": status.document_id, "document_key": key}

    def _start(
        self, status: DocumentStatus, parsed: Parsed, job: Job, refund: Callable[[], Awaitable[None]]
    ) -> asyncio.Task[None]:
        task = asyncio.create_task(self._translate(status, parsed, job, refund))
        self._running[status.document_id] = task
        task.add_done_callback(lambda _: self._running.pop(status.document_id, None))
        return task

    async def _save(self, status: DocumentStatus) -> None:
        body = json.dumps(asdict(status)).encode()
        await self.records.put(KIND, status.document_id, status.owner, body, ttl_s=KEEP_S)

    async def _translate(
        self, status: DocumentStatus, parsed: Parsed, job: Job, refund: Callable[[], Awaitable[None]]
    ) -> None:
        step = self.router.settings.max_texts
        try:
            out = await document_parts.saved(self.records, status.document_id)  # taken over: the chunks done
            self._queued[status.document_id] = status
            async with self.queue.place(status.document_id):
                del self._queued[status.document_id]
                status = replace(status, status="translating", done_segments=len(out), updated=time.time())
                await self._save(status)
                for at in range(len(out), len(parsed.segments), step):
                    chunk = replace(job, req=job.req.model_copy(update={"texts": parsed.segments[at : at + step]}))
                    routed = await translated(self.router, chunk, status, self._save)
                    done = [t.text for t in routed]
                    await document_parts.save(self.records, status.document_id, status.owner, at, done)
                    out += done
                    status = replace(
                        status, done_segments=len(out), updated=time.time(), **remembered(status, routed, at)
                    )
                    await self._save(status)
            result = await asyncio.to_thread(allocator.released, parsed.rebuild, out)
            if not await self._settle(status):  # given up as stopped by another replica, and refunded
                return
            await self.records.put(RESULT, status.document_id, status.owner, result, ttl_s=KEEP_S)
            await self._save(replace(status, status="done", updated=time.time()))
            await document_parts.forget(self.records, status.document_id, len(out), step)
        except asyncio.CancelledError:
            if self._stopping:  # handed over: its status lapsed now, for the next replica that reads it
                with contextlib.suppress(StoreUnavailableError):
                    await self._save(replace(status, updated=0.0))
                raise
            await self._failed(status, "cancelled", refund)  # given up: no result will come, nothing billed
            raise
        except Exception as exc:  # the document fails, said in its status; the server goes on
            known = api_error(exc)
            if known is None:
                logger.exception("document %s failed", status.document_id)
            message = known.detail if known is not None else f"the translation failed ({type(exc).__name__})"
            await self._failed(status, message, refund)
        finally:
            self.queue.forget(status.document_id)
            self._queued.pop(status.document_id, None)

    async def _say_place(self, document_id: str, place: int) -> None:
        """A waiting document's status saying its place (any replica answers its status from the record)."""
        queued = self._queued.get(document_id)
        if queued is not None:
            await self._save(replace(queued, updated=time.time(), queue_position=place))

    async def _failed(self, status: DocumentStatus, message: str, refund: Callable[[], Awaitable[None]]) -> None:
        """The characters given back (unless the document was settled already) and the status saying why, each
        tried though the other's store is down (a store that cannot say who settled it: refunded)."""
        try:
            mine = await self._settle(status)
        except StoreUnavailableError:
            mine = True
        if mine:
            try:
                await refund()
            except ApiError as exc:  # the limits store is down: the characters stay charged, and the log says so
                logger.warning(
                    "document %s: %d characters not refunded (%s)", status.document_id, status.characters, exc
                )
        with contextlib.suppress(StoreUnavailableError):
            await self._save(replace(status, status="error", error_message=message, updated=time.time()))

    async def _take_over(self, status: DocumentStatus) -> DocumentStatus:
        """A document whose replica stopped: translated on from its last chunk saved, here, by the first replica
        to read it so (a claim per lapsed status); where that cannot be (its upload expired, its glossary or memory
        gone, a status from before uploads were kept), refunded and failed (_abandoned)."""
        if not await self.records.claim(LEASE, f"{status.document_id}:{status.updated}", KEEP_S):
            return replace(status, updated=time.time())  # another replica took it over at this moment
        try:
            parsed, req = await document_parts.upload_of(
                self.records, status.document_id, status.filename, status.request
            )
            job = await self.job_of(req, status.owner)
        except Exception as exc:  # whatever stops it going on: refunded, and the log says why
            logger.warning("document %s cannot be taken over (%s)", status.document_id, exc)
            return await self._abandoned(status)
        resumed = replace(status, status="queued", updated=time.time())
        await self._save(resumed)
        self.queue.accept(resumed.document_id, resumed.owner)
        self._start(resumed, parsed, job, functools.partial(self.refund_owner, status.owner, status.characters))
        logger.info("document %s taken over at segment %d", status.document_id, status.done_segments)
        return resumed

    async def stop(self) -> None:
        """The replica stops: each running document handed over (its status lapsed at once), none failed."""
        self._stopping = True
        running = [t for t in self._running.values() if not t.done()]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    async def _settle(self, status: DocumentStatus) -> bool:
        """Whether this caller settles the document: the first to ask, on any replica."""
        return await self.records.claim(SETTLED, status.document_id, KEEP_S)

    async def _abandoned(self, status: DocumentStatus) -> DocumentStatus:
        """A document whose replica stopped mid-way (its status not renewed for STALE_S): refunded to the key
        that uploaded it by the first replica to read it so, and failed for good."""
        if not await self._settle(status):  # settled meanwhile (its replica finished it, or another reader)
            found = await self.records.get(KIND, status.document_id)
            return DocumentStatus(**json.loads(found.body)) if found is not None else status
        stopped = replace(status, status="error", error_message=ABANDONED, updated=time.time())
        await self.refund_owner(status.owner, status.characters)
        with contextlib.suppress(StoreUnavailableError):
            await self._save(stopped)
        return stopped

    async def cancel(self, document_id: str) -> None:
        """Stop a document's translation if it is still running: its status says error, its characters are
        refunded (a client that was answered 504 is not billed for a translation it will not get)."""
        task = self._running.get(document_id)
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def status(self, document_id: str, key: str, owner: str | None) -> DocumentStatus:
        """The document's status for its owner (any owner when None: the key alone is the proof)."""
        found = await self.records.get(KIND, document_id) if document_id.isalnum() else None
        status = DocumentStatus(**json.loads(found.body)) if found is not None else None
        if status is None or owner not in (None, status.owner):
            raise ApiError("document_not_found", f"no document {document_id[:64]!r}")
        if not secrets.compare_digest(status.key_digest, _digest(key)):
            raise ApiError("invalid_document_key", "the document_key is not this document's")
        if status.stale() and document_id not in self._running:
            return await self._take_over(status)
        return status

    async def result_by_key(self, document_id: str, key: str) -> tuple[bytes, DocumentStatus]:
        """A translation read at its secret address (LibreTranslate's download): not found unless the
        key is the document's."""
        try:
            return await self.result(document_id, key, None)
        except ApiError as exc:
            if exc.code == "invalid_document_key":
                raise ApiError("document_not_found", f"no document {document_id[:64]!r}") from None
            raise

    async def result(self, document_id: str, key: str, owner: str | None) -> tuple[bytes, DocumentStatus]:
        status = await self.status(document_id, key, owner)
        answer = status.answer()
        if answer["status"] == "error":
            raise ApiError("document_failed", f"document {document_id} failed: {answer['error_message']}")
        if answer["status"] != "done":
            raise ApiError(
                "document_not_ready",
                f"document {document_id} is {answer['status']}",
                retry_after(RETRY_AFTER_S["document_not_ready"]),
            )
        found = await self.records.get(RESULT, document_id)
        if found is None:
            raise ApiError("document_not_found", f"document {document_id}'s translation has expired")
        return found.body, status


def remembered(status: DocumentStatus, routed: list[Translation], at: int) -> dict[str, Any]:
    """The status's memory counts with a chunk's translations (segments from `at`) added."""
    offered = list(status.memory_suggestions)
    for i, t in enumerate(routed):
        for s in t.memory_suggestions or []:
            if s is not None and len(offered) < MAX_SUGGESTIONS:
                offered.append({"segment": at + i, **s.model_dump()})
    answered = sum(m is not None for t in routed for m in t.memory_matches or [])
    return {"memory_sentences": status.memory_sentences + answered, "memory_suggestions": offered}


async def translated(
    router: PairRouter, chunk: Job, status: DocumentStatus, save: Callable[[DocumentStatus], Awaitable[None]]
) -> list[Translation]:
    """A document chunk's translations (its texts in chunk.req); a refusal for a passing reason (PASSING) is
    waited out and the chunk sent again, the document's status renewed meanwhile (`save`), for up to
    REFUSED_FOR_S of refusals in a row."""
    refused_since: float | None = None
    while True:
        try:
            routed = await router.translate(chunk.req, chunk.terms, pieces=True, recall=chunk.recall)
            return routed.response.translations
        except ApiError as exc:
            now = time.monotonic()
            refused_since = refused_since if refused_since is not None else now
            if exc.code not in PASSING or now - refused_since > REFUSED_FOR_S:
                raise
            await save(replace(status, updated=time.time()))
            await asyncio.sleep(min(float(exc.headers.get("Retry-After", "1")), RETRY_WAIT_S))
