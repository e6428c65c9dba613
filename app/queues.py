"""ModelQueue: one model's waiting items, between the event loop and the device threads.

The event loop puts each admitted request's items into a bounded janus queue, as one entry (one
lock and one hand-over per request, however many items it has). Device threads move them into a
staging area, one deque per priority level, under a lock only they take: choosing between models
needs each model's most urgent item in sight, which a FIFO queue shows only by giving it up, and
an urgent item must overtake a backlog of less urgent ones. Several device threads serving one
model share its staging area (docs/models.md, docs/scheduler.md).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import janus

from app.pending import PendingItem, rows_in
from app.scheduler.lengths import similar


class ModelQueue:
    """A model's admitted items not yet in a batch, by priority level (1 the most urgent).

    ``put``, ``depth``, ``depth_through``, ``open``, ``shutdown`` and ``wait_closed`` run on the
    event loop; ``head`` and ``take`` on device threads. Counts by level are kept as items put
    (by the loop) and taken (by device threads, under the lock), each written by one side only.
    """

    def __init__(self, capacity: int, levels: int = 1) -> None:
        self.capacity = capacity
        self.levels = levels
        self._janus: janus.Queue[list[PendingItem]] | None = None
        self._staged: list[deque[PendingItem]] = [deque() for _ in range(levels)]
        self._put = [0] * levels
        self._taken = [0] * levels
        self._lock = threading.Lock()

    # ---- event loop ------------------------------------------------------------------------------

    def open(self) -> None:
        """Create the janus queue on the running loop (it binds to it). It holds a list of items
        an entry, each at least one item: ``capacity`` entries always fit ``capacity`` items."""
        self._janus = janus.Queue(maxsize=self.capacity)

    def put(self, item: PendingItem) -> None:
        """Queue one admitted item. The caller checked ``depth`` first: this never waits."""
        self.put_all([item])

    def put_all(self, items: list[PendingItem]) -> None:
        """Queue one request's admitted items (one level), together. The caller checked
        ``depth`` first: this never waits."""
        assert self._janus is not None
        if not items:
            return
        self._put[items[0].request.level - 1] += rows_in(items)
        self._janus.async_q.put_nowait(items)

    @property
    def depth(self) -> int:
        """Items (rows: app/pending.py) admitted and not yet taken into a batch."""
        return sum(self._put) - sum(self._taken)

    def depth_through(self, level: int) -> int:
        """Items waiting at ``level`` and the more urgent ones."""
        return sum(self._put[:level]) - sum(self._taken[:level])

    def shutdown(self) -> None:
        """No more puts; device threads still take what is left."""
        if self._janus is not None:
            self._janus.shutdown()

    async def wait_closed(self) -> None:
        if self._janus is not None:
            await self._janus.wait_closed()

    # ---- device threads --------------------------------------------------------------------------

    def _pull(self) -> None:
        """Move everything waiting in janus into the staging area (lock held)."""
        sync_q = self._janus.sync_q if self._janus is not None else None
        while sync_q is not None and sync_q.qsize():  # no exception when empty
            try:
                items = sync_q.get_nowait()
            except (queue.Empty, janus.SyncQueueShutDown):
                return
            self._staged[items[0].request.level - 1].extend(items)

    def head(self) -> PendingItem | None:
        """The most urgent waiting item (the oldest of the most urgent level), left in place;
        None when there is none."""
        with self._lock:
            self._pull()
            for staged in self._staged:
                if staged:
                    return staged[0]
            return None

    def take(self, limit: int) -> list[PendingItem]:
        """Up to ``limit`` waiting items (rows), the most urgent level first, oldest first
        within a level, without waiting (may be empty). A chunk that does not fit whole is
        split: its first rows come now, the rest stay first in line."""
        taken: list[PendingItem] = []
        room = limit
        with self._lock:
            self._pull()
            for level, staged in enumerate(self._staged):
                before = room
                while staged and room:
                    item = staged[0]
                    if item.rows > room:
                        item, staged[0] = item.split(room)
                    else:
                        staged.popleft()
                    taken.append(item)
                    room -= item.rows
                self._taken[level] += before - room
                if not room:
                    break
        return taken

    def take_similar(self, limit: int, length: Callable[[Any], int | None], window: int,
                     max_tokens: int | None, due: float, anchor: int | None = None,
                     held: tuple[int, int] = (0, 0)) -> list[PendingItem]:
        """A batch of items of similar length (app/scheduler/lengths.py) from the oldest
        ``window`` waiting items, the most urgent level first, anchored on the oldest (unless
        ``anchor`` gives a length to match: the batch being filled); items due before ``due``
        join first. ``held``: (items, longest) already in the batch this take adds to."""
        with self._lock:
            self._pull()
            seen: list[tuple[int, int, PendingItem]] = []  # (level, age, item)
            for level, staged in enumerate(self._staged):
                for age, item in enumerate(staged):
                    if len(seen) == window:
                        break
                    seen.append((level, age, item))
            if not seen:
                return []
            lengths = [length(item.data) or 0 for _, _, item in seen]
            target = anchor if anchor is not None else lengths[0]
            urgent = [item.request.earliest <= due for _, _, item in seen]
            chosen = similar(seen, lengths, target, urgent, limit, max_tokens, held)
            everything = len(chosen) == sum(map(len, self._staged))  # then no search to do
            picked = set() if everything else {id(entry[2]) for entry in chosen}
            for level, staged in enumerate(self._staged):
                kept = [] if everything else [i for i in staged if id(i) not in picked]
                self._taken[level] += len(staged) - len(kept)
                staged.clear()
                staged.extend(kept)
            return [entry[2] for entry in chosen]
