"""What travels through the queue, the batching policy, and the blocking batch collector.

``BatchPolicy`` is pure (it is handed the clock's readings); ``collect_batch`` runs on a device
thread and takes items from a model's queue (app/queues.py) without blocking on it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

MIN_NAP_S = 0.0001  # shortest nap while a batch fills (below this, waking costs more than it saves)
UNKNOWN_RATE_NAP_S = 0.0005  # nap while a batch fills before any arrival rate is known


class PendingRequest:
    """One admitted request: its future resolves to the list of per-item results, in order.

    Created and resolved on the event loop. Device threads only read ``deadline`` and call
    ``future.done()`` (a plain attribute read) to skip work nobody waits for. (A plain class with
    slots: one is built per request on the event loop's hot path.)
    """

    __slots__ = ("future", "size", "deadline", "enqueued_at", "results", "remaining", "timer")

    def __init__(
        self, future: asyncio.Future[list[Any]], size: int, deadline: float, enqueued_at: float
    ) -> None:
        self.future = future
        self.size = size
        self.deadline = deadline
        self.enqueued_at = enqueued_at
        self.results: list[Any] = [None] * size
        self.remaining = size
        self.timer: asyncio.TimerHandle | None = None  # the deadline's (event loop only)

    def abandoned(self, now: float) -> bool:
        return self.future.done() or now >= self.deadline


@dataclass(eq=False, slots=True)
class PendingItem:
    """One instance of a request, already decoded: the unit of batching."""

    request: PendingRequest
    index: int
    data: Any
    key: Any = None  # items of different keys (e.g. shapes) never share a model call


@dataclass
class BatchReport:
    """What one batch did, handed from a device thread to the event loop with its results."""

    device: str
    results: list[tuple[PendingItem, Any]]  # a result, or a ServeError for that item
    started_at: float
    sizes: list[int] = field(default_factory=list)  # one per model call (key group)
    compute_s: list[float] = field(default_factory=list)
    expired: int = 0
    cancelled: int = 0


@dataclass(frozen=True)
class BatchPolicy:
    """max-size / max-wait batching, where the wait is a ceiling, not a fixed delay.

    A batch leaves when it holds ``max_batch_size`` items, or when ``max_wait_s`` has passed since
    its first item arrived. It also leaves at once when waiting cannot help:
    - no request other than those already in the batch is in flight (a lone client, or a closed
      loop whose every client is in this batch, would only be kept waiting), or
    - the recent mean gap between request arrivals is longer than the budget still left.
    Under load none of this matters: items pile up while the device is busy, and the next batch
    is filled from the queue without any wait.
    """

    max_batch_size: int
    max_wait_s: float

    def wait_budget(
        self,
        size: int,
        first_at: float,
        now: float,
        gap_s: float | None = None,
        others_in_flight: int | None = None,
    ) -> float:
        """Seconds still worth waiting for more items (0: dispatch now).

        ``gap_s``: recent mean gap between request arrivals, None if unknown.
        ``others_in_flight``: admitted requests not represented in this batch, None if unknown.
        """
        if size >= self.max_batch_size:
            return 0.0
        remaining = first_at + self.max_wait_s - now
        if remaining <= 0.0 or others_in_flight == 0:
            return 0.0
        if gap_s is not None and gap_s > remaining:
            return 0.0
        return remaining


@dataclass
class ArrivalRate:
    """Exponentially weighted mean gap between consecutive request arrivals (seconds)."""

    alpha: float = 0.2
    gap_s: float | None = None
    last: PendingRequest | None = None

    def observe(self, request: PendingRequest) -> None:
        last = self.last
        if last is request:
            return  # another item of the same request: not a new arrival
        self.last = request
        if last is None or request.enqueued_at < last.enqueued_at:
            return
        gap = request.enqueued_at - last.enqueued_at
        self.gap_s = gap if self.gap_s is None else self.gap_s + self.alpha * (gap - self.gap_s)


class ItemSource(Protocol):
    """Where a batch's items come from (a ModelQueue). ``take`` never waits."""

    def take(self, limit: int) -> list[PendingItem]: ...


def collect_batch(
    source: ItemSource,
    policy: BatchPolicy,
    limit: int,
    rate: ArrivalRate,
    in_flight: Callable[[], int] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[PendingItem]:
    """Take what ``source`` holds, then gather more until the policy says go. Device thread only.

    ``limit`` (<= policy.max_batch_size) is the current effective batch limit; ``in_flight``
    reports how many requests are admitted and unanswered. Empty only if ``source`` was.

    While the batch fills, the thread naps until the last arrival that can still join is due at
    the recent arrival rate, then takes what came: it is never woken by a put, and each wake-up
    would trade the GIL with the event loop (about six futex calls per item, docs/benchmarks.md).
    Until a rate is known it naps in short slices.
    """
    batch: list[PendingItem] = []
    requests: set[int] = set()
    effective = BatchPolicy(min(limit, policy.max_batch_size), policy.max_wait_s)
    first_at = 0.0
    while True:
        for item in source.take(effective.max_batch_size - len(batch)):
            if not batch:
                first_at = min(item.request.enqueued_at, clock())
            batch.append(item)
            requests.add(id(item.request))
            rate.observe(item.request)
        if not batch:
            return batch
        others = None if in_flight is None else max(0, in_flight() - len(requests))
        budget = effective.wait_budget(len(batch), first_at, clock(), rate.gap_s, others)
        if budget <= 0.0:
            return batch
        gap = rate.gap_s
        if gap is None:
            sleep(min(budget, UNKNOWN_RATE_NAP_S))
            continue
        # Nap until the last arrival that can still join is due, at the recent rate. Those are
        # at most the free places, the requests in flight elsewhere (a closed-loop client whose
        # answer is on its way back comes again) and what fits in the budget.
        arrivals = effective.max_batch_size - len(batch)
        if others is not None:
            arrivals = min(arrivals, others)
        if gap > 0.0:
            arrivals = min(arrivals, int(budget / gap))
        sleep(min(budget, max(arrivals * gap, MIN_NAP_S)))


def split_live(
    batch: list[PendingItem], now: float
) -> tuple[list[PendingItem], list[PendingItem]]:
    """(items someone still waits for, items cancelled or past their deadline)."""
    live: list[PendingItem] = []
    dead: list[PendingItem] = []
    for item in batch:
        (dead if item.request.abandoned(now) else live).append(item)
    return live, dead


def group_by(items: list[T], key: Callable[[T], Hashable]) -> list[list[T]]:
    """Split items into runs that can share one model call, keeping arrival order within each."""
    groups: dict[Hashable, list[T]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return list(groups.values())
