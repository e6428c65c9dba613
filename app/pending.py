"""What travels through a model's queue: an admitted request, its items, and the report of a
batch that carries their results back to the event loop."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from app.errors import DeadlineExceeded


class PendingRequest:
    """One admitted request: its future resolves to the list of per-item results, in order.

    Created and resolved on the event loop. Device threads only read ``deadline`` and call
    ``future.done()`` (a plain attribute read) to skip work nobody waits for. (A plain class with
    slots: one is built per request on the event loop's hot path.)
    """

    __slots__ = ("future", "deadline", "enqueued_at", "results", "remaining", "timer",
                 "level", "trace")

    def __init__(
        self, future: asyncio.Future[list[Any]], size: int, deadline: float, enqueued_at: float,
        level: int = 1,
    ) -> None:
        self.future = future
        self.deadline = deadline
        self.enqueued_at = enqueued_at
        self.level = level  # priority, 1 the most urgent
        self.results: list[Any] = [None] * size
        self.remaining = size
        self.timer: asyncio.TimerHandle | None = None  # the deadline's (event loop only)
        self.trace: Any = None  # its server span when tracing is on (app/tracing.py)

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
    # One entry per model call (key group): its items, seconds, cost-model work (items, or
    # padded tokens for a model that pads) and real tokens (items, for a model that does not).
    sizes: list[int] = field(default_factory=list)
    compute_s: list[float] = field(default_factory=list)
    work: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    padded: bool = False  # the model pads each batch to its longest item (text)
    expired: int = 0
    cancelled: int = 0


def expire(future: asyncio.Future[list[Any]]) -> None:
    """A request's deadline timer: its answer is DeadlineExceeded unless it has one."""
    if not future.done():
        future.set_exception(
            DeadlineExceeded("the request's deadline passed before it was answered")
        )
