"""API keys, per-key limits and usage. Off unless keys are configured (BEAMSERVE_API_KEYS, or
BEAMSERVE_API_KEYS_FILE for keys with their own limits, or BEAMSERVE_API_KEYS_STORE for the keys `beamserve keys`
keeps in the records store, service/store/api_keys.py): a default server is for loopback use.

A key is read from `Authorization: Bearer <key>`, DeepL's `Authorization: DeepL-Auth-Key <key>`, or
LibreTranslate's `api_key` body field. Limits are counted with the `limits` library: requests per
minute in a moving window, characters per day and per 30 days in fixed windows that start with a
key's first request in them. With BEAMSERVE_LIMITS_STORAGE (redis://...) every gateway replica
counts in one Redis or Valkey; without it each replica counts alone, so N replicas admit up to N
times a key's limits.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from limits import RateLimitItem, RateLimitItemPerDay, RateLimitItemPerMinute
from limits.aio.strategies import FixedWindowRateLimiter, MovingWindowRateLimiter
from limits.errors import StorageError
from limits.storage import storage_from_string

from service.api.client_address import Network, client_address
from service.error_codes import RETRY_AFTER_S
from service.errors import ApiError, retry_after
from service.schemas import KeyUsage
from service.store import api_keys
from service.store.records import Records

UNLIMITED = 10**15  # the amount of a window that only counts
REFRESH_S = 0.5  # a gateway reads the managed keys again at most this long after its last read
# The limits store cannot be reached: limits' own error, or the socket's (a connection the restarting Redis
# closed under a request in flight reaches limits' caller as BrokenPipeError or ConnectionResetError, unwrapped).
STORE_DOWN = (StorageError, OSError)


@dataclass(frozen=True)
class KeyLimits:
    requests_per_minute: int = 0  # 0: no limit
    characters_per_day: int = 0
    characters_per_month: int = 0  # a 30-day window


@dataclass(frozen=True)
class Client:
    """Who a request is billed to: `id` names it in storage and logs (never the key itself)."""

    id: str
    limits: KeyLimits = field(default_factory=KeyLimits)


ANONYMOUS = Client("anonymous")  # every request while keys are off


def client_id(key: str) -> str:
    return api_keys.client_id_of(api_keys.digest(key))


def load_keys(keys: str, keys_file: str, defaults: KeyLimits) -> dict[str, Client]:
    """key -> Client from the comma-separated keys (default limits) and the JSON file, a list of
    {"key", "name"?, "requests_per_minute"?, "characters_per_day"?, "characters_per_month"?}."""
    out = {k.strip(): Client(client_id(k.strip()), defaults) for k in keys.split(",") if k.strip()}
    if keys_file:
        try:
            entries = json.loads(Path(keys_file).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"BEAMSERVE_API_KEYS_FILE {keys_file}: {exc}") from None
        if not isinstance(entries, list):
            raise ValueError(f"BEAMSERVE_API_KEYS_FILE {keys_file}: a JSON list of keys is expected")
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict) or not isinstance(entry.get("key"), str) or not entry["key"]:
                raise ValueError(f"BEAMSERVE_API_KEYS_FILE {keys_file}: entry {i} has no key")
            given = {f: int(entry[f]) for f in KeyLimits.__dataclass_fields__ if entry.get(f) is not None}
            limits = replace(defaults, **given)
            out[entry["key"]] = Client(str(entry.get("name") or client_id(entry["key"])), limits)
    return out


def presented_key(headers: Mapping[str, str], body_key: object = None) -> str | None:
    """The key a request presents, from its Authorization header or LibreTranslate's api_key field."""
    scheme, _, value = headers.get("authorization", "").partition(" ")
    if scheme.lower() in ("bearer", "deepl-auth-key") and value.strip():
        return value.strip()
    # A blank key is no key (401), whichever way it came.
    return body_key.strip() if isinstance(body_key, str) and body_key.strip() else None


class LocalUsage:
    """The anonymous client's characters while keys are off and nothing is shared: the same fixed
    windows as the limits library's (starting with the first request in them), counted in this
    process at a fraction of its cost a request."""

    WINDOWS: ClassVar[dict[str, float]] = {"day": 86_400.0, "month": 30 * 86_400.0}

    def __init__(self) -> None:
        self.windows = {name: [0.0, 0] for name in self.WINDOWS}  # name -> [reset time, characters]

    def add(self, characters: int) -> None:
        now = time.time()
        for name, seconds in self.WINDOWS.items():
            window = self.windows[name]
            if now >= window[0]:
                window[0], window[1] = now + seconds, 0
            window[1] += characters

    def usage(self) -> KeyUsage:
        now, out = time.time(), dict[str, Any]()
        for name in self.WINDOWS:
            reset, used = self.windows[name]
            used = used if now < reset else 0
            out |= {f"characters_{name}": used, f"characters_{name}_limit": 0}
            out[f"characters_{name}_resets_at"] = reset if used else None
        return KeyUsage(client=ANONYMOUS.id, requests_per_minute_limit=0, **out)


class Keys:
    """Identifies clients and keeps their limits and usage."""

    def __init__(
        self,
        clients: dict[str, Client],
        storage: str,
        managed: Records | None = None,
        defaults: KeyLimits = KeyLimits(),
        per_address: KeyLimits = KeyLimits(),
        trusted: tuple[Network, ...] = (),
    ) -> None:
        """clients: the keys of the environment or file; managed: the records store of the keys `beamserve keys`
        manages (service/store/api_keys.py), read again at most REFRESH_S after the last read; per_address: while
        keys are off, each client address's limits (service/api/client_address.py, `trusted` its proxies)."""
        self.clients = clients
        self.managed, self.defaults = managed, defaults
        self.per_address = per_address if per_address != KeyLimits() else None
        self.trusted = trusted
        self.stored: dict[str, Client] = {}  # a managed key's digest -> its client
        self._read_at = -REFRESH_S
        self._reading: asyncio.Lock | None = None
        self.storage_uri = storage or "memory://"
        if "://" not in self.storage_uri:
            raise ValueError(f"limits storage {storage!r} is not a URI (redis://host:6379, valkey://..., memory://)")
        self._limits: tuple[MovingWindowRateLimiter, FixedWindowRateLimiter] | None = None
        # Keys off and no shared store: nothing to limit, the anonymous usage counted here.
        counted_here = not self.enabled and self.per_address is None and self.storage_uri.startswith("memory://")
        self.local = LocalUsage() if counted_here else None

    @property
    def enabled(self) -> bool:
        return bool(self.clients) or self.managed is not None

    async def client(self, headers: Mapping[str, str], body_key: object = None, peer: str | None = None) -> Client:
        """The request's client; ApiError 401 without a key, 403 with one that is not known. Keys off: anonymous,
        or with per-address limits the address the request came from (`peer`: its connection's)."""
        if not self.enabled:
            if self.per_address is not None:
                return Client(f"address-{client_address(peer, headers, self.trusted)}", self.per_address)
            return ANONYMOUS
        key = presented_key(headers, body_key)
        if key is None:
            raise ApiError(
                "missing_api_key",
                "this server needs an API key: Authorization: Bearer <key> (DeepL-Auth-Key <key>, or api_key)",
                {"WWW-Authenticate": "Bearer"},
            )
        found = self.clients.get(key)
        if found is None and self.managed is not None:  # the store's keys as of at most REFRESH_S ago
            if time.monotonic() - self._read_at >= REFRESH_S:
                await self._read_managed(self.managed)
            found = self.stored.get(api_keys.digest(key))
        if found is None:
            raise ApiError("invalid_api_key", "the API key is not valid")
        return found

    async def _read_managed(self, records: Records) -> None:
        """The managed keys as the store holds them now (one read at a time; the requests meanwhile wait for it)."""
        if self._reading is None:
            self._reading = asyncio.Lock()
        async with self._reading:
            if time.monotonic() - self._read_at < REFRESH_S:  # read while this one waited
                return
            keys = await api_keys.listed(records)  # StoreUnavailableError: a 503 store_unavailable
            self.stored = {k.digest: self._managed_client(k) for k in keys}
            self._read_at = time.monotonic()

    def _managed_client(self, key: api_keys.StoredKey) -> Client:
        given = {n: getattr(key, n) for n in api_keys.LIMITS if getattr(key, n)}
        return Client(key.client_id, replace(self.defaults, **given))

    def _limiters(self) -> tuple[MovingWindowRateLimiter, FixedWindowRateLimiter]:
        if self._limits is None:  # made on first use, inside the replica's event loop
            storage = storage_from_string("async+" + self.storage_uri, wrap_exceptions=True)
            self._limits = MovingWindowRateLimiter(storage), FixedWindowRateLimiter(storage)
        return self._limits

    @staticmethod
    def _windows(client: Client) -> list[tuple[str, RateLimitItem]]:
        lim = client.limits
        return [
            ("day", RateLimitItemPerDay(lim.characters_per_day or UNLIMITED, namespace="chars")),
            ("month", RateLimitItemPerDay(lim.characters_per_month or UNLIMITED, 30, namespace="chars")),
        ]

    def client_of(self, client_id: str) -> Client:
        """The client with this id (a document's owner): its limits, for a refund; the defaults for one whose key
        has gone from the keys file or the store since."""
        if not self.enabled:
            return ANONYMOUS if self.per_address is None else Client(client_id, self.per_address)
        known = [*self.clients.values(), *self.stored.values()]
        return next((c for c in known if c.id == client_id), Client(client_id))

    async def charge(self, client: Client, characters: int) -> None:
        """Count one request and its characters against the client's limits; ApiError 429
        (rate_limited, quota_exceeded) with Retry-After past them, 503 when the store cannot be reached."""
        if self.local is not None:
            self.local.add(characters)
            return
        moving, fixed = self._limiters()
        try:
            if client.limits.requests_per_minute:
                rpm = RateLimitItemPerMinute(client.limits.requests_per_minute, namespace="requests")
                if not await moving.hit(rpm, client.id):
                    reset, _ = await moving.get_window_stats(rpm, client.id)
                    raise _refused("rate_limited", f"over {rpm.amount} requests per minute", reset)
            charged: list[RateLimitItem] = []
            for name, item in self._windows(client):
                if not await fixed.hit(item, client.id, cost=characters):
                    for done in [*charged, item]:  # nothing of a refused request stays counted
                        await fixed.storage.incr(done.key_for(client.id), done.get_expiry(), -characters)
                    reset, left = await fixed.get_window_stats(item, client.id)
                    why = f"{characters} characters would pass this key's limit of {item.amount} a {name} ({left} left)"
                    raise _refused("quota_exceeded", why, reset)
                charged.append(item)
        except STORE_DOWN as exc:
            raise _store_down(exc) from None

    async def refund(self, client: Client, characters: int) -> None:
        """Take back a request's characters (it failed: nothing was delivered)."""
        if self.local is not None:
            self.local.add(-characters)
            return
        _, fixed = self._limiters()
        try:
            for _, item in self._windows(client):
                await fixed.storage.incr(item.key_for(client.id), item.get_expiry(), -characters)
        except STORE_DOWN:
            pass  # the store is down: the charge may stand, which errs on the client's side by one request

    async def usage(self, client: Client) -> KeyUsage:
        """Characters used in the current day and 30-day windows, with the limits (0: none)."""
        if self.local is not None:
            return self.local.usage()
        _, fixed = self._limiters()
        out: dict[str, Any] = {"client": client.id}
        try:
            for name, item in self._windows(client):
                reset, left = await fixed.get_window_stats(item, client.id)
                out[f"characters_{name}"] = item.amount - left
                out[f"characters_{name}_limit"] = item.amount if item.amount != UNLIMITED else 0
                out[f"characters_{name}_resets_at"] = reset if item.amount - left else None
        except STORE_DOWN as exc:
            raise _store_down(exc) from None
        out["requests_per_minute_limit"] = client.limits.requests_per_minute
        return KeyUsage(**out)


def _store_down(exc: Exception) -> ApiError:
    """Keyed requests are refused, not served uncounted, while the store is unreachable."""
    return ApiError(
        "limits_unavailable",
        f"the limits store cannot be reached ({exc})",
        retry_after(RETRY_AFTER_S["limits_unavailable"]),
    )


def _refused(code: str, why: str, reset: float) -> ApiError:
    """429 with Retry-After: the seconds until the window `reset` (Unix time) frees enough."""
    return ApiError(code, why, {"Retry-After": str(max(1, math.ceil(reset - time.time())))})
