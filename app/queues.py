"""ModelQueue: one model's waiting items, between the event loop and the device threads.

The event loop puts admitted items into a bounded janus queue. Device threads move them into a
staging area (a deque under a lock only they take) when they decide what to run next: choosing
between models needs each model's oldest item in sight, which a FIFO queue shows only by giving
it up. Several device threads serving one model share its staging area (docs/models.md).
"""

from __future__ import annotations

import queue
import threading
from collections import deque

import janus

from app.batching import PendingItem


class ModelQueue:
    """A model's admitted items not yet in a batch. ``put``, ``depth``, ``open``, ``shutdown``
    and ``wait_closed`` run on the event loop; ``head`` and ``take`` on device threads."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._janus: janus.Queue[PendingItem] | None = None
        self._staged: deque[PendingItem] = deque()
        self._lock = threading.Lock()
        self._closed = False

    # ---- event loop ------------------------------------------------------------------------------

    def open(self) -> None:
        """Create the janus queue on the running loop (it binds to it)."""
        self._janus = janus.Queue(maxsize=self.capacity)

    def put(self, item: PendingItem) -> None:
        """Queue one admitted item. The caller checked ``depth`` first: this never waits."""
        assert self._janus is not None
        self._janus.async_q.put_nowait(item)

    @property
    def depth(self) -> int:
        """Items admitted and not yet taken into a batch."""
        waiting = self._janus.async_q.qsize() if self._janus is not None else 0
        return waiting + len(self._staged)

    def shutdown(self) -> None:
        """No more puts; device threads still take what is left."""
        self._closed = True
        if self._janus is not None:
            self._janus.shutdown()

    async def wait_closed(self) -> None:
        if self._janus is not None:
            await self._janus.wait_closed()

    @property
    def finished(self) -> bool:
        """Shut down, and nothing left to take."""
        return self._closed and self.depth == 0

    # ---- device threads --------------------------------------------------------------------------

    def _pull(self, n: int) -> None:
        """Move up to ``n`` items from janus into the staging area (lock held)."""
        sync_q = self._janus.sync_q if self._janus is not None else None
        while n > 0 and sync_q is not None and sync_q.qsize():  # no exception when empty
            try:
                self._staged.append(sync_q.get_nowait())
            except (queue.Empty, janus.SyncQueueShutDown):
                return
            n -= 1

    def head(self) -> PendingItem | None:
        """The oldest waiting item, left in place; None when there is none."""
        with self._lock:
            if not self._staged:
                self._pull(1)
            return self._staged[0] if self._staged else None

    def take(self, limit: int) -> list[PendingItem]:
        """Up to ``limit`` waiting items, oldest first, without waiting (may be empty)."""
        with self._lock:
            if len(self._staged) < limit:
                self._pull(limit - len(self._staged))
            n = min(limit, len(self._staged))
            return [self._staged.popleft() for _ in range(n)]
