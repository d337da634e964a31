"""The places a gateway replica translates documents in (service/routing/document_jobs.py uses it): a few
at once, handed out in the order documents asked, the waiting ones told their place as it moves (1 for the
next), and a bound on how many wait, in all and per API key, checked before an upload is accepted."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from service.errors import ApiError, retry_after
from service.store.records import StoreUnavailableError

# say(document id, place): record a waiting document's place (a store write, which may fail for a while).
Say = Callable[[str, int], Awaitable[None]]


class DocumentQueue:
    def __init__(self, places: int, waiting: int, per_key: int, say: Say, renew_s: float, refused_wait_s: float):
        """`places` translate at once; at most `waiting` documents wait, `per_key` of one owner's; `say` is
        called, in the waiting document's own task, with its place when it joins, when it moves and every
        `renew_s` besides (its status renewed); a refusal asks to come back after `refused_wait_s`."""
        self.free = places
        self.max_waiting, self.per_key, self.say = waiting, per_key, say
        self.renew_s, self.refused_wait_s = renew_s, refused_wait_s
        self.accepted: dict[str, str] = {}  # id -> owner of each document accepted and not yet translating
        self.waiting: dict[str, asyncio.Future[None]] = {}  # first come first: resolved when handed a place
        self._moved: asyncio.Future[None] | None = None  # resolved (and replaced) when the waiting move up

    def room_for(self, owner: str) -> None:
        """ApiError overloaded when one more document of `owner` would wait past the bounds."""
        owners = list(self.accepted.values())
        if len(owners) >= self.max_waiting or owners.count(owner) >= self.per_key:
            raise ApiError(
                "overloaded",
                f"{len(owners)} documents wait to be translated here, {owners.count(owner)} of them this key's "
                f"(at most {self.max_waiting}, {self.per_key} of one key's); upload it again shortly",
                retry_after(self.refused_wait_s),
            )

    def accept(self, document_id: str, owner: str) -> None:
        """Count the document against the bounds (call right after room_for, with no await between)."""
        self.accepted[document_id] = owner

    def forget(self, document_id: str) -> None:
        """The document no longer waits (it translates, or it ended)."""
        self.accepted.pop(document_id, None)

    @contextlib.asynccontextmanager
    async def place(self, document_id: str) -> AsyncIterator[None]:
        """A place to translate in, held for the block; waits its turn when none is free."""
        if self.free and not self.waiting:
            self.free -= 1
        else:
            turn = asyncio.get_running_loop().create_future()
            self.waiting[document_id] = turn
            try:
                await self.say(document_id, len(self.waiting))  # last: the others' places stay
                while not turn.done():
                    # Its place said by its own task alone: a write from elsewhere could land after the
                    # document's next status ("translating", "done") and undo it.
                    moved = self._moved = self._moved or asyncio.get_running_loop().create_future()
                    await asyncio.wait([turn, moved], timeout=self.renew_s, return_when=asyncio.FIRST_COMPLETED)
                    if not turn.done():
                        with contextlib.suppress(StoreUnavailableError):  # said again at the next move or renewal
                            await self.say(document_id, list(self.waiting).index(document_id) + 1)
            except BaseException:
                if self.waiting.pop(document_id, None) is None:  # handed a place as it ended: give it on
                    self._release()
                raise
        self.forget(document_id)
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        """A place freed: to the document that has waited longest, else back among the free."""
        if not self.waiting:
            self.free += 1
            return
        turn = self.waiting.pop(next(iter(self.waiting)))
        turn.set_result(None)
        if self._moved is not None:  # the others moved up: each says its new place
            self._moved.set_result(None)
            self._moved = None
