"""Background tasks started and left to run, each kept referenced until it is done (the event
loop keeps only a weak reference to a task, which could otherwise be collected mid-run); and a
future's resolver for a callback from another thread."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any


class Background:
    """The tasks one owner started and that still run."""

    def __init__(self) -> None:
        self._running: set[asyncio.Task[Any]] = set()

    def start(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        """Run ``coroutine`` as a task on the running loop."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def wait(self) -> None:
        """Until the tasks running now have ended; the first error of one is raised."""
        await asyncio.gather(*self._running)


def resolver(future: asyncio.Future[None]) -> Callable[[], None]:
    """A callback (on the loop) that resolves ``future`` unless it is done: cancelled, as an
    awaiting ``gather`` cancels it."""
    def resolve() -> None:
        if not future.done():
            future.set_result(None)

    return resolve
