"""A model held in the gateway's own process (Settings.colocate), called as a Serve handle is:
`handle.translate.remote(...)` gives a response to await or cancel. The router (service/routing/pair_router.py)
and the pair status (service/routing/pair_health.py) then treat an in-process model and a model deployment
alike, while a call to it crosses no process, no gRPC and no Serve router.

It holds the served model only by its methods, so this module imports no torch.
"""

import asyncio
import inspect
from collections.abc import Callable, Generator
from typing import Any

from ray.serve.handle import DeploymentHandle


class LocalResponse:
    """One call's answer: awaitable once, cancellable (DeploymentResponse's two uses here). The call runs
    in the task that awaits it, so a cancelled await cancels the call and no task is made per call;
    cancel() before the await drops the call unrun. A method's error, raised at once or by its
    coroutine, is raised where the answer is awaited."""

    def __init__(self, call: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._call, self._args, self._cancelled = call, args, False

    async def _answer(self) -> Any:
        if self._cancelled:
            raise asyncio.CancelledError
        result = self._call(*self._args)
        return await result if inspect.isawaitable(result) else result

    def __await__(self) -> Generator[Any, None, Any]:
        return self._answer().__await__()

    def cancel(self) -> None:
        self._cancelled = True


class LocalMethod:
    def __init__(self, call: Callable[..., Any]) -> None:
        self._call = call

    def remote(self, *args: Any) -> LocalResponse:
        return LocalResponse(self._call, args)


class LocalHandle:
    """The methods a gateway asks of a pair's model (translate, align, score, info), on an object in this
    process; its typed errors reach the router raised as they are, as a replica's reach it wrapped."""

    def __init__(self, model: Any) -> None:
        self.translate = LocalMethod(model.translate)
        self.align = LocalMethod(model.align)
        self.score = LocalMethod(model.score)
        self.info = LocalMethod(model.info)


PairHandle = DeploymentHandle[Any] | LocalHandle  # how the gateway reaches a pair's model
