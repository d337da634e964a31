"""Translation memories as the routes use them, kept in the records store (service/store/records.py) so that
every gateway replica reads the same: a key reaches only its own memories (another key's id is not found, as
an unknown one). A memory is one language pair's units, {source segment: target segment}; its info (name,
pair, unit count, times) is a record of its own, so a listing never reads the units. Each gateway replica
keeps the lookup indexes (service/text/memory.py) of the memories it used last, rebuilt when a memory changes.

Adding units (a translation approved) reads the memory, adds to them and writes it back while holding the
memory's write claim in the store (WRITE_KIND), so that two replicas adding to one memory at the same moment
each add theirs, one after the other; a replica that dies holding the claim holds it WRITE_CLAIM_S at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from service.errors import ApiError
from service.store.records import Records, StoreUnavailableError
from service.text import tmx
from service.text.glossary import checked_name
from service.text.memory import MemoryIndex

KIND = "memory"
INFO_KIND = "memory_info"
ID = re.compile(r"[0-9a-f]{32}")
MAX_MEMORIES = 100  # memories of one API key
MAX_SEGMENT_CHARS = 5_000  # characters of a unit's source or target
WRITE_KIND = "memory-write"  # the claim a replica holds while it adds units to a memory
WRITE_CLAIM_S = 30.0  # how long a claim lasts if its holder never gives it up (a 200,000-unit write takes ~2 s)
WRITE_POLL_S = 0.01


@dataclass(frozen=True)
class Memory:
    memory_id: str
    owner: str
    name: str
    source: str
    target: str
    units: dict[str, str]
    created: float
    updated: float

    def info(self) -> dict[str, Any]:
        return {
            "memory_id": self.memory_id,
            "name": self.name,
            "source": self.source,
            "target": self.target,
            "units": len(self.units),
            "created": self.created,
            "updated": self.updated,
        }

    def dumps(self) -> bytes:
        return orjson.dumps({**self.info(), "owner": self.owner, "units": list(self.units.items())})

    @staticmethod
    def loads(body: bytes) -> Memory:
        d = orjson.loads(body)
        d["units"] = dict(d["units"])
        return Memory(**d)


def checked_units(units: dict[str, str]) -> dict[str, str]:
    """Units within the bounds: MAX_UNITS, and each side at most MAX_SEGMENT_CHARS (ApiError otherwise)."""
    if len(units) > tmx.MAX_UNITS:
        raise ApiError("memory_too_large", f"{len(units)} units; a memory holds at most {tmx.MAX_UNITS}")
    for source, target in units.items():
        if not source.strip() or not target.strip():
            raise ApiError("invalid_memory", "a unit with an empty source or target")
        if max(len(source), len(target)) > MAX_SEGMENT_CHARS:
            raise ApiError("invalid_memory", f"a unit over {MAX_SEGMENT_CHARS} characters: {source[:60]!r}")
    return units


class Memories:
    def __init__(
        self, records: Records, index_bytes: int = 256_000_000, release: Callable[[], None] = lambda: None
    ) -> None:
        """index_bytes: the lookup indexes this replica keeps, at most (Settings.memory_index_bytes); release():
        the heap freed given back to the system, called once an index is dropped (glibc's malloc_trim)."""
        self.records = records
        self.index_bytes = index_bytes
        self.release = release
        self._indexes: OrderedDict[str, tuple[float, MemoryIndex]] = OrderedDict()  # id -> (updated, index)
        self._lock = asyncio.Lock()  # one unit added at a time on this replica

    async def create(self, owner: str, name: str, source: str, target: str, units: dict[str, str]) -> Memory:
        if await self.records.count(KIND, owner) >= MAX_MEMORIES:
            raise ApiError("too_many_memories", f"this key has {MAX_MEMORIES} memories; delete one first")
        now = time.time()
        made = Memory(uuid.uuid4().hex, owner, checked_name(name), source, target, checked_units(units), now, now)
        return await self._put(made)

    async def get(self, memory_id: str, owner: str) -> Memory:
        found = await self.records.get(KIND, memory_id) if ID.fullmatch(memory_id) else None
        if found is None or found.owner != owner:
            raise ApiError("memory_not_found", f"no memory {memory_id[:64]!r}")
        return await asyncio.to_thread(Memory.loads, found.body)

    async def listing(self, owner: str) -> list[dict[str, Any]]:
        infos = [orjson.loads(b) for b in await self.records.owned(INFO_KIND, owner)]
        return sorted(infos, key=lambda info: (info["created"], info["memory_id"]))

    async def delete(self, memory_id: str, owner: str) -> None:
        found = await self.records.get(INFO_KIND, memory_id) if ID.fullmatch(memory_id) else None
        if found is None or found.owner != owner:
            raise ApiError("memory_not_found", f"no memory {memory_id[:64]!r}")
        await self.records.delete(INFO_KIND, memory_id)
        await self.records.delete(KIND, memory_id)
        await self._forget(memory_id)

    async def add(self, memory_id: str, owner: str, units: dict[str, str]) -> Memory:
        """Units added to the memory (a source it holds gets the new target)."""
        checked_units(units)
        async with self._lock, self._writing(memory_id):
            found = await self.get(memory_id, owner)
            merged = checked_units({**found.units, **units})
            return await self._put(Memory(**{**found.__dict__, "units": merged, "updated": time.time()}))

    @contextlib.asynccontextmanager
    async def _writing(self, memory_id: str) -> AsyncIterator[None]:
        """The memory's write claim, held while the block runs: waited for while another replica holds it (at
        most WRITE_CLAIM_S, when a holder died with it); StoreUnavailableError past twice that."""
        deadline = time.monotonic() + 2 * WRITE_CLAIM_S
        while not await self.records.claim(WRITE_KIND, memory_id, WRITE_CLAIM_S):
            if time.monotonic() > deadline:
                raise StoreUnavailableError(f"memory {memory_id} stayed locked for {2 * WRITE_CLAIM_S:.0f}s")
            await asyncio.sleep(WRITE_POLL_S)
        try:
            yield
        finally:
            await self.records.release(WRITE_KIND, memory_id)

    async def index(self, memory_id: str, owner: str, source: str, target: str) -> MemoryIndex:
        """The memory's lookup index for a request of source -> target (ApiError memory_mismatch for another
        pair's memory), built once per change of the memory on this replica."""
        info = await self.records.get(INFO_KIND, memory_id) if ID.fullmatch(memory_id) else None
        if info is None or info.owner != owner:
            if info is None:  # deleted, maybe through another replica: its index goes here too
                await self._forget(memory_id)
            raise ApiError("memory_not_found", f"no memory {memory_id[:64]!r}")
        about = orjson.loads(info.body)
        if (about["source"], about["target"]) != (source, target):
            raise ApiError(
                "memory_mismatch",
                f"memory {memory_id} is for {about['source']} -> {about['target']}, not {source} -> {target}",
            )
        kept = self._indexes.get(memory_id)
        if kept is not None and kept[0] == about["updated"]:
            self._indexes.move_to_end(memory_id)
            return kept[1]
        memory = await self.get(memory_id, owner)
        built = await asyncio.to_thread(lambda: _sized(MemoryIndex(memory.units)))
        stale = self._indexes.pop(memory_id, None)
        self._indexes[memory_id] = (memory.updated, built)
        gone = [stale] if stale is not None else []
        while self.kept_bytes() > self.index_bytes and len(self._indexes) > 1:
            gone.append(self._indexes.popitem(last=False)[1])
        if gone:
            del gone, stale
            await asyncio.to_thread(self.release)
        return built

    def kept_bytes(self) -> int:
        """The bytes of the lookup indexes this replica keeps."""
        return sum(i.nbytes for _, i in self._indexes.values())

    async def _forget(self, memory_id: str) -> None:
        """The memory's index dropped here, and the heap it held given back to the system."""
        if self._indexes.pop(memory_id, None) is not None:
            await asyncio.to_thread(self.release)

    async def _put(self, memory: Memory) -> Memory:
        body = await asyncio.to_thread(memory.dumps)
        await self.records.put(KIND, memory.memory_id, memory.owner, body)
        await self.records.put(INFO_KIND, memory.memory_id, memory.owner, orjson.dumps(memory.info()))
        return memory


def _sized(index: MemoryIndex) -> MemoryIndex:
    """The index with its size counted (on the thread that built it, not the event loop)."""
    _ = index.nbytes
    return index
