"""Which language pairs answer, as last seen: /readyz, /v1/models and the translate routes read it
without waiting on a replica. A pair whose replicas are down or still loading fails its own requests
with 503 (`pair_unavailable`); the gateway, and every other pair, stay in service.

A refresh asks every pair's replica for its info() at once, each within ASK_S, and runs in the
background at most every REFRESH_S: a probe or a request never waits on a replica that cannot answer
(Serve holds a call to a deployment with no running replica until one starts).
"""

import asyncio
import time
from typing import Any

from service.routing.local_handle import PairHandle

ASK_S = 2.0  # a pair's replica that has not answered info() within this is counted down
REFRESH_S = 2.0  # the status is refreshed when it is older than this and someone reads it
FIRST_WAIT_S = 0.8  # before the first refresh has finished, a reader waits this long (a probe's timeout is 1 s)


class PairHealth:
    """Each pair's last info() (None: it did not answer), refreshed in the background."""

    def __init__(self, handles: dict[str, PairHandle]) -> None:
        self.handles = handles
        self.infos: dict[str, dict[str, Any] | None] = {}
        self.checked = float("-inf")  # monotonic time of the last finished refresh
        self._task: asyncio.Task[None] | None = None

    def ready(self, pair: str) -> bool:
        info = self.infos.get(pair)
        return info is not None and bool(info.get("ready"))

    def down(self, pair: str) -> bool:
        """True only for a pair seen not answering at the last refresh (unknown is not down)."""
        return pair in self.infos and not self.ready(pair)

    async def current(self, wait_s: float = FIRST_WAIT_S) -> dict[str, dict[str, Any] | None]:
        """The status, refreshed in the background when stale; waits up to wait_s only while no refresh
        has ever finished."""
        task = self.refresh_soon()
        if not self.infos and task is not None:
            await asyncio.wait({task}, timeout=wait_s)
        return self.infos

    def refresh_soon(self) -> asyncio.Task[None] | None:
        """Start a refresh when the status is older than REFRESH_S and none is running."""
        if self._task is None and time.monotonic() - self.checked > REFRESH_S:
            self._task = asyncio.get_running_loop().create_task(self._refresh())
        return self._task

    async def ask_all(self) -> dict[str, dict[str, Any] | None]:
        """Every pair's info() now (None for one that does not answer within ASK_S); the status too."""
        # One question per deployment, however many pairs it answers (a multilingual model: thousands).
        distinct = {id(h): h for h in self.handles.values()}
        answers = dict(zip(distinct, await asyncio.gather(*(self._ask(h) for h in distinct.values())), strict=True))
        self.infos = {pair: answers[id(h)] for pair, h in self.handles.items()}
        self.checked = time.monotonic()
        return self.infos

    async def _refresh(self) -> None:
        try:
            await self.ask_all()
        finally:
            self._task = None

    @staticmethod
    async def _ask(handle: PairHandle) -> dict[str, Any] | None:
        response = handle.info.remote()
        try:
            async with asyncio.timeout(ASK_S):
                return dict(await response)
        except TimeoutError:  # no replica yet (Serve holds the call until one starts), or a wedged one
            response.cancel()
            return None
        except Exception:  # a deployment that failed to deploy, a replica that died: down now
            return None
