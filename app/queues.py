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

from app.pending import PendingItem


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
        self._put[items[0].request.level - 1] += len(items)
        self._janus.async_q.put_nowait(items)

    @property
    def depth(self) -> int:
        """Items admitted and not yet taken into a batch."""
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
        """Up to ``limit`` waiting items, the most urgent level first, oldest first within a
        level, without waiting (may be empty)."""
        taken: list[PendingItem] = []
        with self._lock:
            self._pull()
            for level, staged in enumerate(self._staged):
                n = min(limit - len(taken), len(staged))
                taken.extend(staged.popleft() for _ in range(n))
                self._taken[level] += n
                if len(taken) == limit:
                    break
        return taken

    def take_similar(self, limit: int, length: Callable[[Any], int | None], window: int,
                     max_tokens: int | None, due: float, anchor: int | None = None,
                     held: tuple[int, int] = (0, 0)) -> list[PendingItem]:
        """A batch of items of similar length, for a model that pads a batch to its longest item
        (docs/scheduler.md, section 5). It looks at the oldest ``window`` items, the most urgent
        level first, and takes the oldest of them (the anchor, unless ``anchor`` gives a length
        to match: the batch being filled), then by level, items whose deadline is before ``due``
        first, then the lengths closest to the anchor's, while the batch stays within ``limit``
        items and ``max_tokens`` padded tokens (a lone item is taken whatever its length).
        ``held``: (items, longest) already in the batch this take adds to."""
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
            lengths = {id(item): length(item.data) or 0 for _, _, item in seen}
            target = anchor if anchor is not None else lengths[id(seen[0][2])]
            order = sorted(seen, key=lambda s: (s[0], s[2].request.deadline > due,
                                                abs(lengths[id(s[2])] - target), s[1]))
            chosen: list[tuple[int, int, PendingItem]] = []
            count, longest = held
            for entry in order:
                if len(chosen) == limit:
                    break
                size = max(longest, lengths[id(entry[2])])
                n = count + len(chosen) + 1
                if n > 1 and max_tokens is not None and size * n > max_tokens:
                    continue
                chosen.append(entry)
                longest = size
            picked = {id(entry[2]) for entry in chosen}
            for level, staged in enumerate(self._staged):
                kept = [i for i in staged if id(i) not in picked]
                self._taken[level] += len(staged) - len(kept)
                staged.clear()
                staged.extend(kept)
            return [entry[2] for entry in sorted(chosen, key=lambda e: (e[0], e[1]))]
