"""What travels through a model's queue: an admitted request, its items, and its answer
(app/report.py carries a batch's results back into them)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.arrays import Results
from app.errors import DeadlineExceeded

_PENDING, _RESULT, _ERROR, _CANCELLED = range(4)
DROPPED = object()  # the result of a chunk's rows whose request went before they were computed


class Answer:
    """A request's answer where no coroutine awaits it (the device process answering its front
    ends, app/bridge.py): the part of ``asyncio.Future`` that ``ServedModel`` and the device
    threads use, which hands the outcome to ``on_done`` as it is set, on the event loop, with no
    loop callback in between. ``key`` names the request to ``on_done``."""

    __slots__ = ("_state", "_value", "_on_done", "key")

    def __init__(self, on_done: Callable[[Any], None], key: Any) -> None:
        self._state = _PENDING
        self._value: Any = None
        self._on_done = on_done
        self.key = key

    def done(self) -> bool:
        return self._state != _PENDING

    def cancelled(self) -> bool:
        return self._state == _CANCELLED

    def result(self) -> Any:
        """The results (only once ``done`` and neither failed nor cancelled)."""
        assert self._state == _RESULT
        return self._value

    def exception(self) -> BaseException | None:
        return self._value if self._state == _ERROR else None

    def set_result(self, value: Any) -> None:
        self._settle(_RESULT, value)

    def set_exception(self, exc: BaseException) -> None:
        self._settle(_ERROR, exc)

    def cancel(self) -> bool:
        if self._state != _PENDING:
            return False
        self._settle(_CANCELLED, None)
        return True

    def _settle(self, state: int, value: Any) -> None:
        if self._state != _PENDING:
            raise asyncio.InvalidStateError("the answer is already set")
        self._state, self._value = state, value
        self._on_done(self)


class RowsAnswer(Answer):
    """The answer of a chunk of one-row requests (``ServedModel`` via app/intake.py): their ids
    and log ids, in row order. Its rows are answered as the batches that hold them are done:
    ``set_rows`` hands ``on_rows`` a run of rows computed together and their results (an array
    of their rows, a list, or one error or ``DROPPED`` for them all); its result (None) says
    every row is answered, and ``on_done`` then (or once it is cancelled) frees its place."""

    __slots__ = ("rids", "log_ids", "_on_rows")

    def __init__(self, on_done: Callable[[Any], None],
                 on_rows: Callable[[RowsAnswer, int, int, Any], None], rids: Sequence[int],
                 log_ids: Sequence[str | None]) -> None:
        super().__init__(on_done, None)
        self._on_rows = on_rows
        self.rids = rids
        self.log_ids = log_ids

    def set_rows(self, at: int, n: int, value: Any) -> None:
        """Rows ``at`` to ``at + n`` are done: ``value`` is their results, or what failed them."""
        self._on_rows(self, at, n, value)


class PendingRequest:
    """One admitted request: its future resolves to the list of per-item results, in order (a
    chunk of one-row requests: its ``RowsAnswer`` takes its rows as they are done).

    Created and resolved on the event loop. Device threads only read ``deadline`` (``earliest``)
    and call ``future.done()`` (a plain attribute read) to skip work nobody waits for. (A plain
    class with slots: one is built per request on the event loop's hot path.)
    """

    __slots__ = ("future", "deadline", "enqueued_at", "results", "remaining", "timer",
                 "level", "trace", "count", "deadlines", "cancelled", "earliest", "cancels")

    def __init__(
        self, future: asyncio.Future[Results] | Answer, size: int, deadline: float,
        enqueued_at: float, level: int = 1,
    ) -> None:
        self.future = future
        self.deadline = deadline
        self.enqueued_at = enqueued_at
        self.level = level  # priority, 1 the most urgent
        self.results: list[Any] = [None] * size
        self.remaining = size
        self.timer: asyncio.TimerHandle | None = None  # the deadline's (event loop only)
        self.trace: Any = None  # its server span when tracing is on (app/tracing.py)
        # Requests it stands for: more than one for a message's one-row requests queued as one
        # chunk (``admit_rows``, app/intake.py), whose rows keep their own deadlines and
        # cancellations (each row one request, answered on its own: app/report.py).
        self.count = 1
        self.deadlines: Sequence[float] | None = None  # a row's each (one-row requests)
        self.cancelled: np.ndarray | None = None  # a flag a row, from the first cancel
        self.earliest = deadline  # the soonest of ``deadlines``
        self.cancels = 0  # rows cancelled

    def abandoned(self, now: float) -> bool:
        return self.future.done() or now >= self.deadline

    def cancel_row(self, row: int) -> None:
        """One request of a chunk of rows has gone: its row is dropped, not computed; the
        chunk is cancelled once all are."""
        if self.cancelled is None:  # set before ``cancels`` counts: device threads read both
            self.cancelled = np.zeros(self.count, dtype=bool)
        if not self.cancelled[row]:
            self.cancelled[row] = True
            self.cancels += 1
            if self.cancels == self.count:
                self.future.cancel()


@dataclass(eq=False, slots=True)
class PendingItem:
    """One instance of a request, already decoded: the unit of batching. Or, with ``rows`` > 1,
    a run of a request's instances stacked in one array (a chunk: its first row is instance
    ``index``), for a model whose rows stack (``ModelHandler.stacks``): one object, one
    result per chunk, however many rows. Counts (queue depth, batch sizes) are in rows."""

    request: PendingRequest
    index: int
    data: Any
    key: Any = None  # items of different keys (e.g. shapes) never share a model call
    rows: int = 1

    def split(self, k: int) -> tuple[PendingItem, PendingItem]:
        """A chunk's first ``k`` rows and the rest (0 < k < rows), as two items."""
        return (_part(self, self.index, self.data[:k], k),
                _part(self, self.index + k, self.data[k:], self.rows - k))


def _part(item: PendingItem, index: int, data: Any, rows: int) -> PendingItem:
    return PendingItem(item.request, index, data[0] if rows == 1 else data, item.key, rows)


LIVE, EXPIRED, CANCELLED = range(3)  # what became of an item's rows by the time it is taken


def row_states(item: PendingItem, now: float) -> list[tuple[int, PendingItem]]:
    """An item of a chunk of one-row requests split into runs of rows in one state: someone
    waits for them, their deadline has passed, or they were cancelled (rows past their deadline
    or cancelled are dropped, not computed, as the items of single requests are)."""
    request = item.request
    assert request.deadlines is not None
    if request.earliest > now and not request.cancels:  # the usual case, without numpy
        return [(LIVE, item)]
    lo, hi = item.index, item.index + item.rows
    cancelled = request.cancelled
    state = np.where(np.asarray(request.deadlines[lo:hi]) <= now, EXPIRED,
                     LIVE if cancelled is None else np.where(cancelled[lo:hi], CANCELLED, LIVE))
    if not state.any():
        return [(LIVE, item)]
    edges = [0, *(np.flatnonzero(np.diff(state)) + 1).tolist(), item.rows]
    if len(edges) == 2:
        return [(int(state[0]), item)]
    return [(int(state[a]), _part(item, lo + a, item.data[a:b], b - a))
            for a, b in zip(edges, edges[1:], strict=False)]


def queue_items(admitted: list[tuple[PendingRequest, Any]], key: Callable[[Any], Any],
                stacks: bool) -> list[PendingItem]:
    """The queue's items for admitted requests and their decoded items (a list, or their rows
    stacked in one array): an item a row, or, for a model whose rows stack, one chunk for a
    request whose rows came stacked."""
    queued: list[PendingItem] = []
    for request, items in admitted:
        n = len(items)
        if n == 1:
            data = items[0]
            queued.append(PendingItem(request, 0, data, key(data)))
        elif stacks and type(items) is np.ndarray:
            queued.append(PendingItem(request, 0, items, None, n))
        else:
            queued.extend(PendingItem(request, index, data, key(data))
                          for index, data in enumerate(items))
    return queued


def rows_request(answer: Answer, deadlines: Sequence[float], now: float, level: int
                 ) -> PendingRequest:
    """One request standing for one-row requests, a row each, with their deadlines."""
    request = PendingRequest(answer, len(deadlines), max(deadlines), now, level)
    request.count = len(deadlines)
    request.deadlines = deadlines
    request.earliest = min(deadlines)
    return request


def rows_in(items: list[PendingItem]) -> int:
    """How many instances ``items`` hold."""
    return sum(item.rows for item in items)


def halves(items: list[PendingItem], rows: int
           ) -> tuple[list[PendingItem], list[PendingItem]] | None:
    """``items`` (``rows`` instances) in two: the first half of the items and the rest, or a
    lone chunk's first half of rows and the rest; None for a single instance."""
    if len(items) > 1:
        return items[:len(items) // 2], items[len(items) // 2:]
    if rows > 1:
        first, rest = items[0].split(rows // 2)
        return [first], [rest]
    return None


def one_request(items: list[PendingItem], rows: int) -> bool:
    """Whether ``items`` (``rows`` instances) are all one client's request: the items of one
    request, or one row of a chunk of one-row requests (each row another client's)."""
    request = items[0].request
    return all(item.request is request for item in items) and (
        request.deadlines is None or rows == 1)


def expire(future: asyncio.Future[Results]) -> None:
    """A request's deadline timer: its answer is DeadlineExceeded unless it has one."""
    if not future.done():
        future.set_exception(
            DeadlineExceeded("the request's deadline passed before it was answered")
        )
