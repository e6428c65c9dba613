"""The device process's end of the front ends' links (docs/frontends.md).

Each front end holds one socket to this process. What it sends (one message per pass of its
event loop): ``requests`` to admit and enqueue, ``cancel`` for requests whose client left,
``answered`` (request durations, one list per model and status a message) and ``rejected``
counts for the metrics, ``sync`` (after a load or unload: answer once every front end holds
the new snapshot), ``acked`` (this front end holds it), ``lacking`` (once its start has
ended, and whenever it changes: the model versions it cannot serve, yet or at all, which the
health answers say, app/state.py) and ``ask`` (a request for this process's own app, which
answers it in-process: app/asks.py). What it gets: ``results`` (a request's results or its
error), ``models`` (the snapshot: what a front end needs to parse, decode and route to each
model version), ``ack`` (say when you hold it), ``synced`` (every front end holds the
snapshot) and ``replied`` (the app's answer to an ``ask``).

Admission is the same gate a single process runs (app/intake.py: room per level and the
deadline-aware refusal), against this process's real queues; a refusal goes back at once. A
message's requests for one model version and level pass it together, in order, and enter the
queue as one entry; where each is one row, as one chunk (app/pending.py). Answers send
themselves as they are set (``Answer``, ``RowsAnswer``): no future, callback or timer per
request here (app/device_link.py, one front end's link). Deadlines are kept by the front ends,
which cancel a request past its own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp

import app.wire as wire
from app.asks import Asked, answer
from app.device_link import FrontEndLink, error_fields
from app.errors import ServeError
from app.intake import admit_all, admit_rows
from app.links import Inbox, Outbox
from app.metrics import ModelMetrics
from app.pending import Answer, RowsAnswer
from app.runtime import InferenceService
from app.snapshot import snapshot
from app.tasks import Background

log = logging.getLogger("batchserve.bridge")

SNAPSHOT_CHECK_S = 0.1  # how often the model set is compared with what the front ends were sent
SYNC_LIMIT_S = 5.0  # the longest a load's answer waits for every front end to hold its model
GATHER_LIMIT_S = 1.0  # the longest a scrape waits for the front ends' request counts


class Bridge:
    """Serves every front end's link on the device process's event loop."""

    def __init__(self, service: InferenceService, frontends: int = 0,
                 app: ASGIApp | None = None) -> None:
        """``frontends``: how many the server runs; it reads loading till as many have
        started. ``app``: the one that answers the front ends' ``ask``."""
        self.service = service
        self.app = app
        self._frontends = frontends
        service.state.frontends_starting = frontends > 0
        self._ending_start = False  # ``_end_start`` is under way or done
        self._links: set[FrontEndLink] = set()
        self._counts: dict[tuple[str, str], ModelMetrics] = {}
        self._tasks = Background(log)
        self._watch: asyncio.Task[None] | None = None
        service.metrics.frontends.set_function(lambda: len(self._links))
        service.before_scrape.append(self.gather_counts)
        service.before_retire.append(self.hold_current)

    async def serve(self, inbox: Inbox, transport: asyncio.Transport,
                    beat: Heartbeat | None = None) -> None:
        """One front end's link, until it closes (its waiting requests are then dropped);
        ``beat`` records when it was last heard from (app/supervisor.py judges hangs)."""
        link = FrontEndLink(Outbox(transport))
        self._links.add(link)
        if beat is not None:  # its first answer starts the clock (start-up is not timed)
            beat.ask = link.ask
            link.ask()
        if self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self._watch_models())
        link.send_models(snapshot(self.service))
        read = self.service.metrics.frontend_messages.inc
        try:
            while True:
                message = await inbox.read()
                read()
                if beat is not None:
                    beat.heard = time.monotonic()
                self._handle(link, message)
        except ConnectionError:
            pass
        finally:
            self._links.discard(link)
            self._lacking_changed()
            for _, pending, _ in list(link.waiting.values()):
                pending.future.cancel()
            for ack in link.acks.values():
                if not ack.done():
                    ack.set_result(None)
            transport.close()

    def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()

    async def _watch_models(self) -> None:
        """Send the snapshot again whenever a model is loaded, unloaded or changes state."""
        while True:
            await asyncio.sleep(SNAPSHOT_CHECK_S)
            now = snapshot(self.service)
            for link in self._links:
                if link.sent != now:
                    link.send_models(now)

    async def _acknowledged(self, limit_s: float) -> None:
        """Every front end has answered an ``ack`` (``limit_s`` at most): it has read what was
        sent before, and sent before its answer what it held and every request it routed."""
        acks = [link.ask() for link in list(self._links)]
        if acks:
            await asyncio.wait(acks, timeout=limit_s)

    async def gather_counts(self) -> None:
        """Before a scrape of /metrics: every front end sends the request counts it holds
        (app/frontend/link.py); a second at most."""
        await self._acknowledged(GATHER_LIMIT_S)

    async def hold_current(self) -> None:
        """Every front end holds the current snapshot, having sent every request it routed by
        the one before. A load awaits it before its replaced versions drain, which would
        refuse what front ends still route to them."""
        now = snapshot(self.service)
        for link in list(self._links):
            link.send_models(now)
        await self._acknowledged(SYNC_LIMIT_S)

    async def _sync_all(self, origin: FrontEndLink, tokens: list[int]) -> None:
        """``hold_current``, then tell ``origin``: after a load through one front end, every
        front end routes to it."""
        await self.hold_current()
        for token in tokens:
            origin.outbox.add("synced", token)

    def _handle(self, link: FrontEndLink, message: dict[str, list[Any]]) -> None:
        # Stacked: a request's rows stay one array, which a model whose rows stack queues as
        # one chunk (app/pending.py).
        for group, values in zip(message.get("requests", ()),
                                 wire.grouped_values(message, "requests", stacked=True),
                                 strict=True):
            self._admit(link, group, values)
        for rid in message.get("cancel", ()):
            held = link.waiting.get(rid)
            if held is not None:
                pending = held[1]
                answer = pending.future
                if isinstance(answer, RowsAnswer):  # its row of a chunk
                    pending.cancel_row(answer.rids.index(rid))
                else:
                    answer.cancel()
        for name, version, reason in message.get("rejected", ()):
            self._metrics(name, version).rejected(reason)
        for name, version, status, protocol, durations in message.get("answered", ()):
            self._metrics(name, version).answered_all(status, durations, protocol)
        for key in message.get("acked", ()):
            ack = link.acks.pop(key, None)
            if ack is not None and not ack.done():
                ack.set_result(None)
        reports = message.get("lacking")
        if reports:
            link.lacking = {(name, version): status for name, version, status in reports[-1]}
            link.started = link.started or "loading" not in link.lacking.values()
            self._lacking_changed()
        tokens = message.get("sync")
        if tokens:
            self._tasks.start(self._sync_all(link, tokens), "the front ends' sync to the models")
        for token, asked in message.get("ask", ()):
            self._tasks.start(self._answer(link, token, asked), "a front end's request")

    async def _answer(self, link: FrontEndLink, token: int, asked: Asked) -> None:
        assert self.app is not None, "a Bridge that answers asks is given the app"
        link.outbox.add("replied", (token, await answer(self.app, asked)))

    def _lacking_changed(self) -> None:
        """What the front ends cannot serve, together (``unavailable`` over ``loading``), and
        whether they have all started: the health answers' (app/state.py)."""
        state = self.service.state
        lack: dict[tuple[str, str], str] = {}
        for link in self._links:
            for key, status in link.lacking.items():
                if lack.get(key) != "unavailable":
                    lack[key] = status
        state.frontends_lack = lack
        if (state.frontends_starting and not self._ending_start
                and sum(link.started for link in self._links) >= self._frontends):
            self._ending_start = True
            self._tasks.start(self._end_start(), "the front ends' start")

    async def _end_start(self) -> None:
        """Every front end has started: the server reads loading till each also holds the
        models the start-up loads made ready, with their handlers. A front end that started
        before those loads ended learns of them by snapshot, and till then refuses them as
        loading, which a probe that read ready would send traffic to."""
        while self.service.repository.starting:
            await self.service.changed()
        await self.hold_current()
        self.service.state.frontends_starting = False

    def _metrics(self, name: str, version: str) -> ModelMetrics:
        key = (name, version)
        metrics = self._counts.get(key)
        if metrics is None:
            metrics = self._counts[key] = self.service.metrics.for_model(name, version)
        return metrics

    def _admit(self, link: FrontEndLink, group: tuple[Any, ...], values: Any) -> None:
        """Admit and enqueue one message's requests for one model version and level together
        (app/intake.py), in the order they came; a refusal is sent back at once. Where each
        is one row (one item) and no span is kept a request, they are one chunk: one request
        that stands for them all (``admit_rows``), queued as one item if the model's rows
        stack, else an item a row (a text model's token ids, batched by length)."""
        name, version, level, entries = group  # entries: (id, deadline, log id, items)
        try:
            model = self.service.repository.get(name, version)
        except ServeError as exc:
            for rid, *_ in entries:
                link.outbox.add("results", (rid, error_fields(exc), 0))
            return
        rids, deadlines, log_ids, sizes = zip(*entries, strict=True)
        if len(values) == len(entries) == sizes.count(1) and model.tracing is None:
            request, refused = admit_rows(model, level, values, deadlines, lambda kept: RowsAnswer(
                link.done_rows, link.answer_rows, rids if kept is None else [rids[i] for i in kept],
                log_ids if kept is None else [log_ids[i] for i in kept]))
            if request is not None:  # each request's row is its place in the answer's ids
                answer = request.future
                assert isinstance(answer, RowsAnswer)
                link.waiting.update(dict.fromkeys(answer.rids, (model, request, None)))
            for i, refusal in refused:
                link.outbox.add("results", (rids[i], error_fields(refusal), 0))
            return
        at = 0
        requests = []
        for rid, deadline, n in zip(rids, deadlines, sizes, strict=True):
            requests.append(([values[at]] if n == 1 else values[at:at + n], deadline,
                             Answer(link.done, rid)))
            at += n
        outcomes = admit_all(model, level, requests)
        for rid, log_id, outcome in zip(rids, log_ids, outcomes, strict=True):
            if isinstance(outcome, ServeError):
                link.outbox.add("results", (rid, error_fields(outcome), 0))
            else:
                link.waiting[rid] = (model, outcome, log_id)


@dataclass(eq=False)
class Heartbeat:
    """When a front end's link last brought a message (None: not yet), and how to ask it for
    one (``FrontEndLink.ask``, set once it is served)."""

    heard: float | None = None
    ask: Callable[[], object] | None = None
