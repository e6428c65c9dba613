"""Stuck device threads: a model call that does not return (docs/operations.md, "Overload,
faults and shutdown").

A device thread times each call that may block on the model or the device (``CallClock``: a
batch's model call, the wait for its device work); ``watch_stalls``, on the event loop, marks a
thread stuck once its call has run past its limit and clears the mark when the call returns. A
thread cannot be stopped from outside, nor a hung CUDA context trusted again, so a stuck thread
is reported (health, liveness, ``batchserve_device_up``), not replaced: the orchestrator
restarts the server. Meanwhile nothing waits on it for ever: a load that needs it fails
(``check_not_stuck``) and an unload, or a shutdown, goes on without it (``unless_stuck``,
``ended_unless_stuck``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol, TypeVar

from app.errors import Unavailable
from app.served import ServedModel

log = logging.getLogger("batchserve.service")

LEAST_DEFAULT_S = 10.0  # the default's floor: a model with a short timeout does not flap
WATCH_S = 1.0  # the longest between two looks


@dataclass(frozen=True, eq=False)
class Call:
    since: float  # time.monotonic() at its start
    model: ServedModel
    rows: int


class CallClock:
    """``call`` is written by its device thread (``timing``) and read on the loop; ``stuck``
    (the call judged stuck, while it runs) is the loop's."""

    def __init__(self) -> None:
        self.call: Call | None = None
        self.stuck: Call | None = None

    @contextmanager
    def timing(self, model: ServedModel, rows: int) -> Iterator[None]:
        self.call = Call(time.monotonic(), model, rows)
        try:
            yield
        finally:
            self.call = None


class Clocked(Protocol):
    @property
    def label(self) -> str: ...

    @property
    def clock(self) -> CallClock: ...


class Joinable(Clocked, Protocol):
    def join(self, timeout: float | None = None) -> bool: ...


T = TypeVar("T", bound=Clocked)


def limit_s(call: Call, setting: float | None) -> float:
    """``device_timeout_s`` where set, else the model's request timeout: a call that ran that
    long has answered none of its requests in time, and the requests admitted behind it could
    only time out too (at least LEAST_DEFAULT_S)."""
    if setting is not None:
        return setting
    return max(LEAST_DEFAULT_S, call.model.settings.request_timeout_s)


def judge(threads: Iterable[T], now: float, setting: float | None) -> list[T]:
    """The threads whose mark changed at ``now``: a call past its limit is marked stuck (once),
    and the mark goes when that call has returned."""
    changed = []
    for thread in threads:
        clock = thread.clock
        call, stuck = clock.call, clock.stuck
        if call is not None and call is not stuck and now - call.since >= limit_s(call, setting):
            clock.stuck = call
            log.critical("device thread %s is stuck: model %s's call on a batch of %d rows has "
                         "run %.0f s (device_timeout_s %.0f); health says unhealthy and "
                         "/v2/health/live 503 while it runs, for the orchestrator to restart "
                         "the server", thread.label, call.model.name, call.rows,
                         now - call.since, limit_s(call, setting))
            changed.append(thread)
        elif stuck is not None and call is not stuck:
            clock.stuck = None
            log.warning("device thread %s goes on: model %s's stuck call has returned",
                        thread.label, stuck.model.name)
            changed.append(thread)
    return changed


async def watch_stalls(threads: Iterable[T], setting: float | None,
                       changed: Callable[[T], None]) -> None:
    """Judge ``threads`` (a live view: the runtime's list) every second, or a quarter of a
    shorter ``setting``, and tell ``changed`` of each change."""
    every = min(WATCH_S, setting / 4) if setting is not None else WATCH_S
    while True:
        await asyncio.sleep(every)
        for thread in judge(threads, time.monotonic(), setting):
            changed(thread)


def check_not_stuck(thread: Clocked) -> None:
    """Raise Unavailable (``unhealthy``) while ``thread`` is stuck in a call: what needs the
    thread (a load) would wait for a call that may never return."""
    stuck = thread.clock.stuck
    if stuck is not None:
        seconds = time.monotonic() - stuck.since
        raise Unavailable("unhealthy", f"device thread {thread.label} is stuck in a call "
                          f"(model {stuck.model.name}'s, for {seconds:.0f} s)")


async def unless_stuck(done: asyncio.Future[None], thread: Clocked) -> bool:
    """Wait for ``done`` (a command ``thread`` runs between calls) unless the thread is, or
    becomes, stuck in a call, which may never return. Whether it was done."""
    while not done.done() and thread.clock.stuck is None:
        await asyncio.wait({done}, timeout=WATCH_S)
    return done.done()


async def ended_unless_stuck(thread: Joinable, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for ``thread`` to end, unless it is, or becomes, stuck in a call
    (a stopping server need not wait for it: device threads are daemons). Whether it ended; an
    error line says why not."""
    end = time.monotonic() + timeout_s
    while thread.clock.stuck is None:
        left = end - time.monotonic()
        if left <= 0:
            log.error("device thread %s did not stop within %.0fs", thread.label, timeout_s)
            return False
        if await asyncio.to_thread(thread.join, min(WATCH_S, left)):
            return True
    log.error("device thread %s is stuck in a call; not waited for", thread.label)
    return False
