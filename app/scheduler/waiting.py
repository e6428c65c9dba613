"""The batching policy and the blocking batch collector (what travels through the queue:
app/pending.py).

``BatchPolicy`` is pure (it is handed the clock's readings); ``collect_batch`` runs on a device
thread and takes items from a model's queue (app/queues.py) without blocking on it.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np

from app.pending import CANCELLED, EXPIRED, LIVE, PendingItem, PendingRequest, row_states

T = TypeVar("T")

MIN_NAP_S = 0.0001  # shortest nap while a batch fills (below this, waking costs more than it saves)
UNKNOWN_RATE_NAP_S = 0.0005  # nap while a batch fills before any arrival rate is known
# Arrivals due within this share of the batch in hand's time are a closed loop's clients on their
# way back, not an open loop's next requests: worth waiting for whenever the device then serves
# more items per second (docs/scheduler.md, section 2).
RETURNING_SHARE = 0.25
TRIPS_KNOWN = 4  # round trips seen before a closed loop's is trusted


# Seconds a batch like the one in hand would take at each of the given item counts (an array).
Price = Callable[[np.ndarray], np.ndarray]


Wait = tuple[float, int]  # seconds to wait for more items, and how many arrivals that is for
NO_WAIT: Wait = (0.0, 0)


@dataclass(frozen=True)
class BatchPolicy:
    """When a batch starts: the contract (the inequalities: docs/scheduler.md, section 2).

    A full batch, or one that holds every request in flight, starts at once. Otherwise it waits
    for the most arrivals whose joining finishes the items sooner on average, or, for arrivals
    due almost at once, serves more items per second, the wait counted. It never waits past
    ``max_wait_s`` of device idleness nor past the time its tightest deadline (or latency
    target) still allows. Pure: every reading of the clock and the queue is handed to it.
    """

    max_batch_size: int
    max_wait_s: float

    def wait_s(self, size: int, idle_s: float, gap_s: float | None, others: int | None,
               price: Price | None, slack_s: float = float("inf"),
               returning: tuple[float, float] | None = None) -> Wait:
        """Seconds worth waiting for more items before starting a batch of ``size``, and how
        many arrivals that wait is for (``NO_WAIT``: go).

        ``idle_s``: how long the device has waited for this batch already. ``gap_s``: the
        recent typical gap between request arrivals (None: unknown). ``others``: admitted
        requests not in this batch (None: unknown). ``price``: the cost model (None: unknown,
        then any arrival within the budget is worth waiting for). ``returning``: (the time a
        client takes to come back after its answer, the time since the latest answers were
        sent), from ``ArrivalRate.returning``; used only where that round trip is within
        ``RETURNING_SHARE`` of ``t(k)``, the mark of a closed loop (an open loop's arrivals
        are spread over the whole batch)."""
        free = self.max_batch_size - size
        remaining = min(self.max_wait_s - idle_s, slack_s)
        if free <= 0 or others == 0 or remaining <= 0.0:
            return NO_WAIT
        arrivals = free if others is None else min(free, others)
        # One call prices every size this wait could reach: cost[n] is a batch of n items.
        cost = None if price is None else price(np.arange(size + arrivals + 1, dtype=np.float64))
        now_s = None if cost is None else float(cost[size])
        loop = _closed_loop(returning, now_s)
        back = loop[1] if loop is not None else None
        if gap_s is None and back is None:
            return min(remaining, UNKNOWN_RATE_NAP_S), 1  # look again soon
        # Each of m more items is due at d(m), never sooner than the one before: the m due in
        # time are a prefix, and so are those whose batch still ends within the slack.
        m = np.arange(1.0, arrivals + 1.0)
        d = m * gap_s if gap_s is not None else np.full(arrivals, np.inf)
        if back is not None:
            np.minimum(d, back, out=d)
        reach = int(np.searchsorted(d, remaining, side="right"))
        if cost is None or now_s is None:  # any arrival in time is worth waiting for
            return (float(d[reach - 1]), reach) if reach else NO_WAIT
        whole = cost[size + 1:size + 1 + reach]  # the batch with them
        together = d[:reach] + whole
        late = together > slack_s
        if late.any():
            reach = int(late.argmax())
            whole, together = whole[:reach], together[:reach]
        m, d, alone = m[:reach], d[:reach], cost[1:reach + 1]  # alone: the m served after
        grown = size + m
        # More items per second (for arrivals due almost at once), or all of them sooner.
        pays = grown * together < size * now_s + m * (now_s + alone)
        pays |= (d <= RETURNING_SHARE * now_s) & (grown * now_s > size * together)
        if loop is not None:  # taking turns, each part's round trip hidden by the other's batch
            pays &= loop[0] + whole < now_s + alone
        if not pays.any():
            return NO_WAIT
        best = reach - 1 - int(pays[::-1].argmax())
        return float(d[best]), best + 1


def _closed_loop(returning: tuple[float, float] | None,
                 now_s: float | None) -> tuple[float, float] | None:
    """(a closed loop's round trip, seconds until its clients answered last are back), or None:
    no round trip known, none short enough against a batch of ``now_s`` to be a closed loop's,
    or the clients so late (twice the round trip) that they are not coming. Once they are late,
    the wait runs to that give-up point; a nap ends as soon as they arrive. Never less than the
    shortest nap, which is what waiting at all costs."""
    if returning is None or now_s is None:
        return None
    trip, since = returning
    if trip > RETURNING_SHARE * now_s or since >= 2 * trip:
        return None
    return trip, max(trip - since if since < trip else 2 * trip - since, MIN_NAP_S)


@dataclass
class ArrivalRate:
    """What a device thread knows of a model's arrivals: the typical gap between consecutive
    requests, and how long a client takes to come back after its answer.

    The gap is the median of the last few. Closed loops arrive in bursts (a batch's clients come
    back together) and a mean would mix the gaps inside a burst with the long one between
    bursts; the median is the gap inside. Two clients taking turns have one gap of each kind, so
    there the median says nothing; the round trip does. It is the time from the latest answers
    sent (``answered``) to each arrival, the upper quartile of the last few: in a closed loop
    a short, steady time; in an open loop spread over the whole time between answers."""

    window: int = 16
    last: PendingRequest | None = None
    gaps: deque[float] = field(init=False)  # the last ``window`` of each
    trips: deque[float] = field(init=False)
    answers: deque[float] = field(default_factory=lambda: deque(maxlen=4))

    def __post_init__(self) -> None:
        self.gaps = deque(maxlen=self.window)
        self.trips = deque(maxlen=self.window)

    def observe(self, request: PendingRequest) -> None:
        last = self.last
        if last is request:
            return  # another item of the same request: not a new arrival
        self.last = request
        arrived = request.enqueued_at
        more = min(request.count, self.window) - 1  # a chunk's other requests came with it
        for answered in reversed(self.answers):
            if answered <= arrived:
                self.trips.extend([arrived - answered] * (1 + more))
                break
        if last is not None and arrived >= last.enqueued_at:
            self.gaps.append(arrived - last.enqueued_at)
        self.gaps.extend([0.0] * more)

    def answered(self, now: float) -> None:
        """A batch's answers were sent at ``now`` (the device thread's clock)."""
        self.answers.append(now)

    @property
    def gap_s(self) -> float | None:
        return statistics.median(self.gaps) if self.gaps else None

    def returning(self, now: float) -> tuple[float, float] | None:
        """(the round trip, seconds since the latest answers), or None until a few are known."""
        if len(self.trips) < TRIPS_KNOWN or not self.answers:
            return None
        trips = sorted(self.trips)
        return trips[(3 * len(trips)) // 4], now - self.answers[-1]


@dataclass
class RecentPeak:
    """The most requests in flight at once within the last one to two seconds (windows of
    ``window_s``): how many clients a closed loop has, even at the moment its batch has been
    answered and they are all on their way back. Noted on the event loop, read by device threads
    (a read that races a note misjudges one wait at most)."""

    window_s: float = 1.0
    peak: int = 0  # in the current window
    last: int = 0  # in the window before it
    started: float = float("-inf")  # when the current window started

    def note(self, in_flight: int, now: float) -> None:
        age = now - self.started
        if age >= self.window_s:
            self.last = self.peak if age < 2 * self.window_s else 0
            self.peak, self.started = 0, now
        if in_flight > self.peak:
            self.peak = in_flight

    def value(self, now: float) -> int:
        age = now - self.started
        if age >= 2 * self.window_s:
            return 0
        return self.peak if age >= self.window_s else max(self.peak, self.last)


class ItemSource(Protocol):
    """Where a batch's items come from (a ModelQueue). ``take`` never waits."""

    def take(self, limit: int) -> list[PendingItem]: ...


def collect_batch(
    source: ItemSource,
    policy: BatchPolicy,
    limit: int,
    rate: ArrivalRate,
    concurrency: Callable[[], int] | None = None,
    pricing: Callable[[list[PendingItem]], Price | None] | None = None,
    latency_target_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    nap: Callable[[float, int], None] = lambda seconds, _: time.sleep(seconds),
) -> list[PendingItem]:
    """Take what ``source`` holds, then wait for more while ``policy`` says it pays, and return
    the batch. Runs on a device thread; it never blocks on the queue, only ``nap``s until the
    items it waits for are queued or the time is up (app/bell.py), so a filling batch wakes the
    thread once rather than at every put. Empty only if ``source`` was. It never returns more
    than ``limit`` items (the effective batch limit).

    ``concurrency``: requests to expect in flight (admitted now, or as many as were recently);
    ``pricing``: the cost model's price for a batch like the items held; ``latency_target_s``:
    the oldest item's predicted completion must stay within it.
    """
    batch: list[PendingItem] = []
    size = 0  # rows (a chunk holds several: app/pending.py)
    requests: set[int] = set()  # those in the batch (a chunk of rows may stand for several)
    counted = 0
    effective = BatchPolicy(min(limit, policy.max_batch_size), policy.max_wait_s)
    started = clock()
    while True:
        for item in source.take(effective.max_batch_size - size):
            batch.append(item)
            size += item.rows
            if id(item.request) not in requests:
                requests.add(id(item.request))
                counted += item.request.count
            rate.observe(item.request)
        if not batch:
            return batch
        now = clock()
        slack = min(i.request.earliest for i in batch) - now
        if latency_target_s is not None:
            oldest = min(i.request.enqueued_at for i in batch)
            slack = min(slack, oldest + latency_target_s - now)
        others = None if concurrency is None else max(0, concurrency() - counted)
        price = pricing(batch) if pricing is not None else None
        wait, expected = effective.wait_s(size, now - started, rate.gap_s, others, price,
                                          slack, rate.returning(now))
        if wait <= 0.0:
            return batch
        nap(max(wait, MIN_NAP_S), expected)


def split_live(batch: list[PendingItem], now: float) -> tuple[list[PendingItem], ...]:
    """(items someone still waits for, items past their deadline, items cancelled). An item of
    a chunk of one-row requests splits into runs of rows, each run where its rows belong."""
    split: tuple[list[PendingItem], ...] = ([], [], [])
    for item in batch:
        request = item.request
        if request.deadlines is not None and not request.future.done():
            for state, part in row_states(item, now):
                split[state].append(part)
        elif not request.abandoned(now):
            split[LIVE].append(item)
        else:
            split[EXPIRED if now >= request.deadline else CANCELLED].append(item)
    return split


def group_by(items: list[T], key: Callable[[T], Hashable]) -> list[list[T]]:
    """Split items into runs that can share one model call, keeping arrival order within each."""
    groups: dict[Hashable, list[T]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return list(groups.values())
