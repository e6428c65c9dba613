"""Background tasks started and left to run, each kept referenced until it is done (the event
loop keeps only a weak reference to a task, which could otherwise be collected mid-run); and a
future's resolver for a callback from another thread."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any


class Background:
    """The tasks one owner started and that still run; a task that fails is logged in one line
    on ``log`` (asyncio would print its traceback when the task is collected)."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._running: set[asyncio.Task[Any]] = set()

    def start(self, coroutine: Coroutine[Any, Any, Any], what: str,
              failed: Callable[[], object] | None = None) -> None:
        """Run ``coroutine`` as a task on the running loop; ``what`` names it in the log, and
        ``failed`` is called if it raises."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._running.add(task)
        task.add_done_callback(functools.partial(self._ended, what, failed))

    def _ended(self, what: str, failed: Callable[[], object] | None,
               task: asyncio.Task[Any]) -> None:
        self._running.discard(task)
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            self._log.error("%s failed: %s: %s", what, type(exc).__name__, exc)
            if failed is not None:
                failed()

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
