"""Background tasks started and left to run: each kept referenced until it is done (the event
loop keeps only a weak reference to a task, which could otherwise be collected mid-run)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
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
