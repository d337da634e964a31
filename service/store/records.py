"""Records that every gateway replica shares: glossaries, documents and their translations. A record
is bytes under a kind and an id, with its owner (the API key's client id) and, for documents, an
expiry. They live in a Redis or Valkey server (the one the API keys' limits use, or one of their
own), else in an SQLite file on the node.

`records_storage`: redis://, rediss://, valkey:// or valkeys://
URLs, or sqlite:///path. Unset: the limits store when it is a Redis or Valkey, else
sqlite:///~/.local/share/beamserve/records.sqlite3 (the replicas of one node share it; on several
nodes, use a Redis).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from service.errors import CodedError

DEFAULT_FILE = "~/.local/share/beamserve/records.sqlite3"
REDIS_SCHEMES = {"redis": "redis", "rediss": "rediss", "valkey": "redis", "valkeys": "rediss"}
PREFIX = "beamserve:"


@dataclass(frozen=True)
class Record:
    owner: str
    body: bytes


class Records(Protocol):
    async def put(self, kind: str, rid: str, owner: str, body: bytes, ttl_s: float | None = None) -> None: ...
    async def get(self, kind: str, rid: str) -> Record | None: ...
    async def owned(self, kind: str, owner: str) -> list[bytes]: ...
    async def count(self, kind: str, owner: str) -> int: ...
    async def delete(self, kind: str, rid: str) -> None: ...
    async def claim(self, kind: str, rid: str, ttl_s: float) -> bool: ...
    async def release(self, kind: str, rid: str) -> None: ...


def storage_of(records_storage: str, limits_storage: str) -> str:
    if records_storage:
        return records_storage
    if limits_storage.split("://")[0] in REDIS_SCHEMES:
        return limits_storage
    return f"sqlite:///{DEFAULT_FILE}"


def unshared(uri: str, most_gateways: int, hosts: int) -> str | None:
    """Why a store cannot serve `most_gateways` gateway replicas on a cluster of `hosts` hosts, or None: an SQLite
    file is one host's, so where gateways can run on several hosts a document or glossary made through one
    would be unknown to the next (each pod's file on Kubernetes)."""
    if uri.partition("://")[0] != "sqlite" or most_gateways <= 1 or hosts <= 1:
        return None
    return (
        f"records_storage is an SQLite file of one host ({uri}), but up to {most_gateways} gateway replicas run on "
        f"a cluster of {hosts} hosts: glossaries and documents made through one would be unknown to the others. "
        "Set records_storage (BEAMSERVE_RECORDS_STORAGE) to a Redis or Valkey every gateway reaches, or run one "
        "gateway replica (the Gateway deployment's num_replicas, or its autoscaling_config's max_replicas)."
    )


def open_records(uri: str) -> Records:
    """The store a URI names; ValueError for one beamserve cannot use."""
    scheme, sep, rest = uri.partition("://")
    if scheme == "sqlite" and sep and rest.startswith("/"):
        return SqliteRecords(Path(rest[1:]).expanduser())
    if scheme in REDIS_SCHEMES and sep:
        return RedisRecords(f"{REDIS_SCHEMES[scheme]}://{rest}")
    raise ValueError(f"records_storage {uri!r}: a redis://, rediss://, valkey:// or sqlite:///path URI")


class StoreUnavailableError(CodedError):
    """The store cannot be reached, or is not a store (a file that is not a database)."""

    code = "store_unavailable"


def _down(exc: Exception) -> StoreUnavailableError:
    return StoreUnavailableError(f"the glossary and document store cannot be reached ({exc})")


class SqliteRecords:
    """One table in a file; each call opens its own connection in a thread (WAL: readers do not wait).
    Expired records are never answered, and go when a record of their kind is written."""

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
                db.execute(
                    "CREATE TABLE IF NOT EXISTS records "
                    "(kind TEXT, id TEXT, owner TEXT, body BLOB, expires REAL, PRIMARY KEY (kind, id))"
                )
                db.execute("CREATE INDEX IF NOT EXISTS by_owner ON records (kind, owner)")
                self._ready = True
            with db:  # one transaction
                yield db
        finally:
            db.close()

    async def _run(self, *statements: tuple[str, tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        def run() -> list[tuple[Any, ...]]:
            rows: list[tuple[Any, ...]] = []
            with self._db() as db:
                for sql, args in statements:
                    rows = db.execute(sql, args).fetchall()
            return rows

        try:
            return await asyncio.to_thread(run)
        except (sqlite3.Error, OSError) as exc:  # a file that is not a database, a directory not to be made
            raise _down(exc) from None

    async def put(self, kind: str, rid: str, owner: str, body: bytes, ttl_s: float | None = None) -> None:
        now = time.time()
        expires = now + ttl_s if ttl_s is not None else None
        await self._run(
            ("DELETE FROM records WHERE kind = ? AND expires < ?", (kind, now)),
            ("INSERT OR REPLACE INTO records VALUES (?, ?, ?, ?, ?)", (kind, rid, owner, body, expires)),
        )

    async def get(self, kind: str, rid: str) -> Record | None:
        sql = "SELECT owner, body FROM records WHERE kind = ? AND id = ? AND (expires IS NULL OR expires > ?)"
        rows = await self._run((sql, (kind, rid, time.time())))
        return Record(rows[0][0], bytes(rows[0][1])) if rows else None

    async def owned(self, kind: str, owner: str) -> list[bytes]:
        sql = "SELECT body FROM records WHERE kind = ? AND owner = ? AND (expires IS NULL OR expires > ?)"
        return [bytes(r[0]) for r in await self._run((sql, (kind, owner, time.time())))]

    async def count(self, kind: str, owner: str) -> int:
        sql = "SELECT COUNT(*) FROM records WHERE kind = ? AND owner = ? AND (expires IS NULL OR expires > ?)"
        return int((await self._run((sql, (kind, owner, time.time()))))[0][0])

    async def delete(self, kind: str, rid: str) -> None:
        await self._run(("DELETE FROM records WHERE kind = ? AND id = ?", (kind, rid)))

    async def claim(self, kind: str, rid: str, ttl_s: float) -> bool:
        """True for the first caller to claim (kind, rid) within ttl_s, whichever replica: one transaction."""
        now = time.time()
        rows = await self._run(
            ("DELETE FROM records WHERE kind = ? AND expires < ?", (kind, now)),
            ("INSERT OR IGNORE INTO records VALUES (?, ?, '', x'', ?)", (kind, rid, now + ttl_s)),
            ("SELECT changes()", ()),
        )
        return bool(rows[0][0])

    async def release(self, kind: str, rid: str) -> None:
        """A claim given up before its time: the next caller's claim succeeds."""
        await self._run(("DELETE FROM records WHERE kind = ? AND id = ? AND owner = ''", (kind, rid)))


class RedisRecords:
    """A record a hash {owner, body} under PREFIX + kind + id (expiring with Redis' own TTL); each
    owner's ids of a kind in a set, pruned of expired ids as it is read."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._client: Any = None

    def _redis(self) -> Any:
        if self._client is None:
            import coredis

            self._client = coredis.Redis.from_url(self.url, decode_responses=False)
        return self._client

    async def _do(self, name: str, *args: Any, **options: Any) -> Any:
        try:
            return await getattr(self._redis(), name)(*args, **options)
        except Exception as exc:  # coredis' connection and protocol errors alike: the store is down
            raise _down(exc) from None

    @staticmethod
    def _key(kind: str, rid: str) -> str:
        return f"{PREFIX}{kind}:{rid}"

    @staticmethod
    def _owner_key(kind: str, owner: str) -> str:
        return f"{PREFIX}{kind}:owner:{owner}"

    async def put(self, kind: str, rid: str, owner: str, body: bytes, ttl_s: float | None = None) -> None:
        """The record, its expiry and its owner's index in one transaction (MULTI/EXEC): a record is written
        with its expiry or not at all."""
        key = self._key(kind, rid)
        try:
            pipe = await self._redis().pipeline(transaction=True)
            pipe.delete([key])  # a record written again loses its old expiry and fields
            pipe.hset(key, {"owner": owner.encode(), "body": body})
            if ttl_s is not None:
                pipe.pexpire(key, max(1, int(ttl_s * 1000)))
            pipe.sadd(self._owner_key(kind, owner), [rid])
            await pipe.execute()
        except Exception as exc:  # as _do: the store is down
            raise _down(exc) from None

    async def get(self, kind: str, rid: str) -> Record | None:
        found = await self._do("hgetall", self._key(kind, rid))
        if not found:
            return None
        return Record(found[b"owner"].decode(), bytes(found[b"body"]))

    async def owned(self, kind: str, owner: str) -> list[bytes]:
        out = []
        for rid in sorted(await self._do("smembers", self._owner_key(kind, owner))):
            body = await self._do("hget", self._key(kind, rid.decode()), "body")
            if body is None:  # expired
                await self._do("srem", self._owner_key(kind, owner), [rid])
            else:
                out.append(bytes(body))
        return out

    async def count(self, kind: str, owner: str) -> int:
        """The owner's live records of a kind, their bodies not read: its ids, and how many of their keys
        exist (one EXISTS for all of them; an expired id counts nothing)."""
        ids = await self._do("smembers", self._owner_key(kind, owner))
        if not ids:
            return 0
        return int(await self._do("exists", [self._key(kind, rid.decode()) for rid in ids]))

    async def claim(self, kind: str, rid: str, ttl_s: float) -> bool:
        """True for the first caller to claim (kind, rid) within ttl_s, whichever replica: one SET NX."""
        from coredis.tokens import PureToken

        key = f"{PREFIX}claim:{kind}:{rid}"
        return bool(await self._do("set", key, b"1", condition=PureToken.NX, px=max(1, int(ttl_s * 1000))))

    async def release(self, kind: str, rid: str) -> None:
        """A claim given up before its time: the next caller's claim succeeds."""
        await self._do("delete", [f"{PREFIX}claim:{kind}:{rid}"])

    async def delete(self, kind: str, rid: str) -> None:
        found = await self.get(kind, rid)
        await self._do("delete", [self._key(kind, rid)])
        if found is not None:
            await self._do("srem", self._owner_key(kind, found.owner), [rid])
