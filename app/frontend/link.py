"""A front end's link to the device process (docs/frontends.md): requests out, results and the
model snapshot in, each request answered exactly once; and the requests for the device
process's own app (``ask``: everything that is not inference), answered there in-process.

``submit`` sends a request and keeps its deadline here (a timer): past it, the answer is
DeadlineExceeded and the device process is told to drop it. An answer relayed from the device
process resolves it otherwise; if the device process goes away first, every request waiting
here is answered 503 ``unhealthy``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import app.wire as wire
from app.arrays import Results, listed_rows
from app.asks import Asked, Replied
from app.errors import Relayed, Unavailable
from app.links import Inbox, Outbox
from app.pending import expire
from app.snapshot import Snapshot
from app.tasks import Background

log = logging.getLogger("batchserve.frontend")

GONE = "the device process has stopped"
BUSY_AT = 16  # requests waiting here from which a message waits a pass for more (app/links.py)


@dataclass(eq=False, slots=True)
class RemoteRequest:
    rid: int
    future: asyncio.Future[Results]
    timer: asyncio.TimerHandle  # its deadline's


class DeviceLink:
    """This front end's socket to the device process: requests out, results and the model
    snapshot in."""

    def __init__(self) -> None:
        self.waiting: dict[int, RemoteRequest] = {}
        self.snapshot = Snapshot()
        self.gone = False
        # Called with each new snapshot; what one returns is awaited before the snapshot is
        # acknowledged (the handlers of its models, made on threads).
        self.on_snapshot: list[Callable[[Snapshot], Awaitable[Any] | None]] = []
        self._acking = Background(log)
        self._ids = itertools.count(1)
        self._syncs: dict[int, asyncio.Future[None]] = {}
        self._asks: dict[int, asyncio.Future[Replied]] = {}
        self._outbox: Outbox | None = None
        self._task: asyncio.Task[None] | None = None

    async def open(self, inbox: Inbox, transport: asyncio.Transport) -> None:
        """Start on a connected socket; returns once the first snapshot is in."""
        self._outbox = Outbox(transport, busy=lambda: len(self.waiting) >= BUSY_AT)
        self._apply(await inbox.read())
        self._task = asyncio.get_running_loop().create_task(self._run(inbox))

    def send(self, kind: str, entry: Any) -> None:
        if self._outbox is not None and not self.gone:
            self._outbox.add(kind, entry)

    def tally(self, kind: str, key: tuple[Any, ...], value: Any) -> None:
        """Send ``value`` in a message's one entry of ``kind`` for ``key`` (``Outbox.group``),
        held up to ``links.HOLD_S`` (counts for the metrics: a scrape asks for them)."""
        if self._outbox is not None and not self.gone:
            self._outbox.group(kind, key, value, hold=True)

    def submit(self, key: tuple[str, str, int], deadline: float, log_id: str | None,
               items: list[Any]) -> RemoteRequest:
        """Send one request for ``key`` (model, version, level) and return what will hold its
        answer. The deadline is kept here: past it, the answer is DeadlineExceeded and the
        device process is told to drop the request. A message's requests travel one group per
        key (``Outbox.group``)."""
        rid = next(self._ids)
        loop = asyncio.get_running_loop()
        timer = loop.call_later(deadline - time.monotonic(), self._expire, rid)
        request = self.waiting[rid] = RemoteRequest(rid, loop.create_future(), timer)
        if self._outbox is not None and not self.gone:
            self._outbox.group("requests", key, (rid, deadline, log_id, len(items)), items)
        return request

    def drop(self, request: RemoteRequest) -> None:
        """Its caller is done with ``request``: if it is still waiting (its client left; the
        disconnect watch may have cancelled its future already), the device process drops its
        items."""
        request.timer.cancel()
        request.future.cancel()
        if request.rid in self.waiting:  # neither answered nor past its deadline
            self._cancel(request.rid)

    def _expire(self, rid: int) -> None:
        request = self.waiting.get(rid)
        if request is not None and not request.future.done():
            expire(request.future)
            self._cancel(rid)

    def _cancel(self, rid: int) -> None:
        """Stop waiting for ``rid``; the device process drops its items."""
        self.waiting.pop(rid, None)
        self.send("cancel", rid)

    async def sync(self) -> None:
        """Wait until every front end holds a snapshot taken after everything this one sent so
        far was handled (a load or unload it relayed)."""
        token = next(self._ids)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._syncs[token] = future
        self.send("sync", token)
        try:
            await future
        finally:
            self._syncs.pop(token, None)

    async def ask(self, request: Asked) -> Replied:
        """The device process's app's answer to ``request``; Unavailable once that process is
        gone. A caller that stops waiting (a timeout) leaves the answer to be dropped."""
        if self.gone:
            raise Unavailable("unhealthy", GONE)
        token = next(self._ids)
        future: asyncio.Future[Replied] = asyncio.get_running_loop().create_future()
        self._asks[token] = future
        self.send("ask", (token, request))
        try:
            return await future
        finally:
            self._asks.pop(token, None)

    async def _run(self, inbox: Inbox) -> None:
        try:
            while True:
                self._apply(await inbox.read())
        except ConnectionError:
            pass
        self._lost()

    def _apply(self, message: dict[str, list[Any]]) -> None:
        values = wire.values_of(message, "results")
        at = 0
        for rid, error, n in message.get("results", ()):
            future = self._answered(rid)
            if future is not None:
                if error is None:
                    future.set_result(values[at:at + n])
                else:
                    future.set_exception(Relayed(*error))
            at += n
        # A request whose rows were computed together: its rows as one block.
        for rid, block in zip(message.get("block", ()), wire.values_of(message, "block"),
                              strict=True):
            future = self._answered(rid)
            if future is not None:
                future.set_result(block)
        # One-row requests answered together: their ids, and their rows as one block.
        for rids, block in zip(message.get("rows", ()), wire.values_of(message, "rows"),
                               strict=True):
            for rid, row in zip(rids, listed_rows(block), strict=True):
                future = self._answered(rid)
                if future is not None:
                    future.set_result([row])
        making = []
        snapshots = message.get("models")
        if snapshots:
            self.snapshot = snapshots[-1]
            for callback in self.on_snapshot:
                if (awaited := callback(self.snapshot)) is not None:
                    making.append(awaited)
        acks = message.get("ack")
        if acks and making:  # acknowledged once the handlers its models need are made here
            self._acking.start(self._ack_when(making, acks), "acknowledging a snapshot")
        elif acks:
            self._ack(acks)
        for token, replied in message.get("replied", ()):
            asked = self._asks.get(token)
            if asked is not None and not asked.done():
                asked.set_result(replied)
        for token in message.get("synced", ()):
            waiter = self._syncs.get(token)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def _answered(self, rid: int) -> asyncio.Future[Results] | None:
        """The future to resolve with ``rid``'s answer, its deadline off; None if nobody waits
        for it any more (answered 504 by its deadline, or its client left)."""
        request = self.waiting.pop(rid, None)
        if request is None or request.future.done():
            return None
        request.timer.cancel()
        return request.future

    async def _ack_when(self, making: list[Awaitable[Any]], acks: list[Any]) -> None:
        await asyncio.wait([asyncio.ensure_future(m) for m in making])
        self._ack(acks)

    def _ack(self, acks: list[Any]) -> None:
        for key in acks:
            self.send("acked", key)
        self._flush()  # with the counts it holds: a scrape waits for them

    def _flush(self) -> None:
        """Send what waits to go now, what is held (``tally``) too."""
        if self._outbox is not None and not self.gone:
            self._outbox.flush()

    def _lost(self) -> None:
        """The device process is gone: everything waiting is answered 503 unhealthy."""
        if self.gone:
            return
        self.gone = True
        log.critical("%s; answering 503 and exiting", GONE)
        futures: list[asyncio.Future[Any]] = [*(r.future for r in self.waiting.values()),
                                              *self._syncs.values(), *self._asks.values()]
        for future in futures:
            if not future.done():
                future.set_exception(Unavailable("unhealthy", GONE))
        self.waiting.clear()

    def close(self) -> None:
        """Send what is held (``tally``) and stop reading."""
        self._flush()
        if self._task is not None:
            self._task.cancel()
