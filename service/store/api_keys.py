"""API keys people manage (`beamserve keys add|list|revoke|rotate`): each key a record of the records store
(service/store/records.py) under the SHA-256 of the key, never the key itself, with its name and limits. Every
gateway replica reads them from the store (service/api/keys.py), so a key added, revoked or rotated holds on
all of them within a second, without a restart.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from dataclasses import asdict, dataclass

from service.store.records import Records

KIND = "api_key"
OWNER = "beamserve-keys"  # every stored key under one owner: listed together
LIMITS = ("requests_per_minute", "characters_per_day", "characters_per_month")


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def client_id_of(key_digest: str) -> str:
    """A key's client id, from its SHA-256: what storage, usage and logs name its holder by."""
    return "key-" + key_digest[:16]


@dataclass(frozen=True)
class StoredKey:
    """A key as the store holds it: its digest, a name for people and logs, its limits (0: the server's default),
    and its owner: the client id its memories, glossaries, documents and usage are kept under (the first key's
    of that name, kept through every rotation; "" in records written before there was one: the key's own)."""

    digest: str
    name: str
    requests_per_minute: int = 0
    characters_per_day: int = 0
    characters_per_month: int = 0
    created: float = 0.0
    owner: str = ""

    @property
    def client_id(self) -> str:
        return self.owner or client_id_of(self.digest)


async def listed(records: Records) -> list[StoredKey]:
    out = [StoredKey(**json.loads(body)) for body in await records.owned(KIND, OWNER)]
    return sorted(out, key=lambda k: k.name)


async def add(records: Records, name: str, limits: dict[str, int], owner: str = "") -> str:
    """A new key named `name` (ValueError if one has that name), stored by its digest, owning what `owner` owns
    (by default a new owner: its own client id); returns the key, which only its holder keeps from now on."""
    if not name.strip():
        raise ValueError("a key needs a name")
    if any(k.name == name for k in await listed(records)):
        raise ValueError(f"a key named {name!r} exists: revoke or rotate it")
    key = "bs-" + secrets.token_urlsafe(32)
    sha = digest(key)
    given = {n: int(limits.get(n) or 0) for n in LIMITS}
    stored = StoredKey(sha, name, **given, created=time.time(), owner=owner or client_id_of(sha))
    await records.put(KIND, stored.digest, OWNER, json.dumps(asdict(stored)).encode())
    return key


async def revoke(records: Records, name: str) -> StoredKey:
    """Remove the key named `name` (KeyError if there is none); its holder's next requests get 403."""
    found = next((k for k in await listed(records) if k.name == name), None)
    if found is None:
        raise KeyError(f"no key named {name!r}")
    await records.delete(KIND, found.digest)
    return found


async def rotate(records: Records, name: str) -> str:
    """A new key in place of the one named `name`, with its limits and its owner (what the old key made and used is
    the new one's); the old one stops working."""
    old = await revoke(records, name)
    return await add(records, name, {n: getattr(old, n) for n in LIMITS}, old.client_id)
