"""Where glossaries live, shared by every gateway replica: the Redis or Valkey server the API keys'
limits use (or one of its own), else an SQLite file on the node. Each glossary is stored whole,
under its id, with its owner; a key sees only its own.

`glossary_storage`: redis://, rediss://, valkey:// or valkeys:// URLs, or sqlite:///path. Unset:
the limits store when it is a Redis or Valkey, else sqlite:///~/.local/share/beamserve/glossaries.sqlite3
(the replicas of one node share it; on several nodes, use a Redis).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from service.errors import ApiError
from service.glossary import MAX_GLOSSARIES, Glossary, Terms, checked, digest

DEFAULT_FILE = "~/.local/share/beamserve/glossaries.sqlite3"
REDIS_SCHEMES = {"redis": "redis", "rediss": "rediss", "valkey": "redis", "valkeys": "rediss"}
PREFIX = "beamserve:glossary:"
ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")  # a glossary id: a UUID


class GlossaryStore(Protocol):
    async def put(self, glossary: Glossary) -> None: ...
    async def get(self, glossary_id: str) -> Glossary | None: ...
    async def owned(self, owner: str) -> list[Glossary]: ...
    async def delete(self, glossary: Glossary) -> None: ...


def storage_of(glossary_storage: str, limits_storage: str) -> str:
    if glossary_storage:
        return glossary_storage
    if limits_storage.split("://")[0] in REDIS_SCHEMES:
        return limits_storage
    return f"sqlite:///{DEFAULT_FILE}"


def open_store(uri: str) -> GlossaryStore:
    """The store a URI names; ValueError for one beamserve cannot use."""
    scheme, sep, rest = uri.partition("://")
    if scheme == "sqlite" and sep and rest.startswith("/"):
        return SqliteStore(Path(rest[1:]).expanduser())
    if scheme in REDIS_SCHEMES and sep:
        return RedisStore(f"{REDIS_SCHEMES[scheme]}://{rest}")
    raise ValueError(f"glossary storage {uri!r}: a redis://, rediss://, valkey:// or sqlite:///path URI")


def _down(exc: Exception) -> ApiError:
    return ApiError("glossaries_unavailable", f"the glossary store cannot be reached ({exc})", {"Retry-After": "5"})


class SqliteStore:
    """One table in a file; each call opens its own connection in a thread (WAL: readers do not wait)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._ready = False

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        if not self._ready:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, timeout=10)
        try:
            if not self._ready:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("CREATE TABLE IF NOT EXISTS glossaries (id TEXT PRIMARY KEY, owner TEXT, body TEXT)")
                db.execute("CREATE INDEX IF NOT EXISTS by_owner ON glossaries (owner)")
                self._ready = True
            with db:  # one transaction
                yield db
        finally:
            db.close()

    async def _run(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        def run() -> list[tuple[Any, ...]]:
            with self._db() as db:
                return db.execute(sql, args).fetchall()

        try:
            return await asyncio.to_thread(run)
        except (sqlite3.Error, OSError) as exc:  # a file that is not a database, a directory not to be made
            raise _down(exc) from None

    async def put(self, glossary: Glossary) -> None:
        row = (glossary.glossary_id, glossary.owner, glossary.dumps())
        await self._run("INSERT INTO glossaries VALUES (?, ?, ?)", *row)

    async def get(self, glossary_id: str) -> Glossary | None:
        rows = await self._run("SELECT body FROM glossaries WHERE id = ?", glossary_id)
        return Glossary.loads(rows[0][0]) if rows else None

    async def owned(self, owner: str) -> list[Glossary]:
        rows = await self._run("SELECT body FROM glossaries WHERE owner = ?", owner)
        return sorted((Glossary.loads(r[0]) for r in rows), key=lambda g: g.created)

    async def delete(self, glossary: Glossary) -> None:
        await self._run("DELETE FROM glossaries WHERE id = ?", glossary.glossary_id)


class RedisStore:
    """A glossary a string under PREFIX + id; each owner's ids in a set."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._client: Any = None

    def _redis(self) -> Any:
        if self._client is None:
            import coredis

            self._client = coredis.Redis.from_url(self.url, decode_responses=True)
        return self._client

    async def _do(self, name: str, *args: Any) -> Any:
        try:
            return await getattr(self._redis(), name)(*args)
        except Exception as exc:  # coredis' connection and protocol errors alike: the store is down
            raise _down(exc) from None

    async def put(self, glossary: Glossary) -> None:
        await self._do("set", PREFIX + glossary.glossary_id, glossary.dumps())
        await self._do("sadd", f"{PREFIX}owner:{glossary.owner}", [glossary.glossary_id])

    async def get(self, glossary_id: str) -> Glossary | None:
        body = await self._do("get", PREFIX + glossary_id)
        return Glossary.loads(body) if body else None

    async def owned(self, owner: str) -> list[Glossary]:
        ids = sorted(await self._do("smembers", f"{PREFIX}owner:{owner}"))
        bodies = await self._do("mget", [PREFIX + i for i in ids]) if ids else []
        return sorted((Glossary.loads(b) for b in bodies if b), key=lambda g: g.created)

    async def delete(self, glossary: Glossary) -> None:
        await self._do("delete", [PREFIX + glossary.glossary_id])
        await self._do("srem", f"{PREFIX}owner:{glossary.owner}", [glossary.glossary_id])


TERMS_KEPT = 256  # glossaries whose compiled terms a gateway replica keeps


class Glossaries:
    """The store as the routes use it: a key reaches only its own glossaries (another key's id is not
    found, as an unknown one), and each glossary's terms are compiled once per content."""

    def __init__(self, store: GlossaryStore) -> None:
        self.store = store
        self._terms: dict[str, Terms] = {}

    async def create(self, glossary: Glossary) -> Glossary:
        if len(await self.store.owned(glossary.owner)) >= MAX_GLOSSARIES:
            raise ApiError("too_many_glossaries", f"this key has {MAX_GLOSSARIES} glossaries; delete one first")
        await self.store.put(glossary)
        return glossary

    async def get(self, glossary_id: str, owner: str) -> Glossary:
        found = await self.store.get(glossary_id) if ID.fullmatch(glossary_id) else None
        if found is None or found.owner != owner:
            raise ApiError("glossary_not_found", f"no glossary {glossary_id[:64]!r}")
        return found

    async def owned(self, owner: str) -> list[Glossary]:
        return await self.store.owned(owner)

    async def delete(self, glossary_id: str, owner: str) -> None:
        await self.store.delete(await self.get(glossary_id, owner))

    async def terms(self, given: str | dict[str, str] | None, source: str, target: str, owner: str) -> Terms | None:
        """A request's glossary (an id, or its own entries) as Terms; ApiError when the id is unknown
        or the glossary is for another language pair."""
        if given is None:
            return None
        if isinstance(given, dict):
            entries = checked(given)
        else:
            glossary = await self.get(given, owner)
            if (glossary.source, glossary.target) != (source, target):
                own, asked = f"{glossary.source} -> {glossary.target}", f"{source} -> {target}"
                raise ApiError("glossary_mismatch", f"glossary {given} is for {own}; the request is {asked}")
            entries = glossary.entries
        key = digest(entries)
        if (found := self._terms.get(key)) is None:
            if len(self._terms) >= TERMS_KEPT:
                self._terms.pop(next(iter(self._terms)))
            found = self._terms[key] = Terms(entries)
        return found
