"""The device process's end of one front end's link: the requests it waits to answer there,
the last snapshot sent, the acknowledgements asked for, what the front end reported it cannot
serve, and each answer sent back as it is set (one result, a block of rows, a chunk's rows or
an error) with its place in the queue freed."""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.errors import ServeError
from app.links import Outbox
from app.pending import DROPPED, Answer, PendingRequest, RowsAnswer
from app.served import ServedModel
from app.snapshot import Snapshot

log = logging.getLogger("batchserve.bridge")


def error_fields(exc: ServeError) -> tuple[int, str, str, int | None]:
    return exc.status, exc.type, exc.message, exc.retry_after_s


@dataclass(eq=False)
class FrontEndLink:
    """One front end's link as the device process holds it (app/bridge.py serves it)."""

    outbox: Outbox
    # Each admitted request's model, its place in the queue and its log id; the requests of a
    # chunk of one-row requests share one entry (their log ids are their answer's).
    waiting: dict[int, tuple[ServedModel, PendingRequest, str | None]] = field(
        default_factory=dict)
    sent: Snapshot | None = None  # the last snapshot sent
    # What the front end last reported it cannot serve, (model, version) -> status, and whether
    # it has reported once with nothing loading (its start, models made, has ended)
    lacking: dict[tuple[str, str], str] = field(default_factory=dict)
    started: bool = False
    acks: dict[int, asyncio.Future[None]] = field(default_factory=dict)
    _keys: itertools.count[int] = field(default_factory=itertools.count)

    def send_models(self, snap: Snapshot) -> None:
        self.sent = snap
        self.outbox.add("models", snap)

    def ask(self) -> asyncio.Future[None]:
        """Ask the front end to answer (``acked``) once it has read what was sent before; its
        answer brings what it held back (its request counts)."""
        key = next(self._keys)
        future = self.acks[key] = asyncio.get_running_loop().create_future()
        self.outbox.add("ack", key)
        return future

    def done(self, answer: Answer) -> None:
        """A request's answer is set (or it was cancelled): send it, and free its place."""
        rid = answer.key
        held = self.waiting.pop(rid, None)
        log_id = None
        if held is not None:
            model, pending, log_id = held
            model.finish(pending)
        if answer.cancelled():
            return  # the front end cancelled it, or went away
        exc = answer.exception()
        if exc is None:
            results = answer.result()
            if type(results) is np.ndarray:  # its rows computed in one model call: one block
                self.outbox.add("block", rid, [results])
            else:
                self.outbox.add("results", (rid, None, len(results)), results)
        else:
            self._failed(rid, exc, log_id)

    def answer_rows(self, answer: RowsAnswer, at: int, n: int, value: Any) -> None:
        """Rows ``at`` to ``at + n`` of a chunk of one-row requests are done, in one batch: send
        each its result (as one block where they are an array of their rows) or its error;
        nothing for rows dropped. Their places are freed with the chunk's (``done_rows``)."""
        rids = answer.rids
        if value is DROPPED:
            return
        if isinstance(value, BaseException):
            for i in range(at, at + n):
                self._failed(rids[i], value, answer.log_ids[i])
        elif n == 1:
            self.outbox.add("results", (rids[at], None, 1), [value])
        elif type(value) is np.ndarray:  # computed in one model call
            self.outbox.add("rows", rids[at:at + n], [value])
        else:
            self.outbox.add_all("results", [(rid, None, 1) for rid in rids[at:at + n]],
                                list(value))

    def done_rows(self, answer: RowsAnswer) -> None:
        """A chunk of one-row requests has every row answered (``answer_rows``), or it was
        cancelled (its rows not yet answered get nothing): free its requests' places."""
        # Popped in C (``map``), not in a loop of Python: 12 bytecodes a row, most of what the
        # device process's event loop runs a request (python -m bench.device --opcodes).
        popped = list(map(self.waiting.pop, answer.rids, itertools.repeat(None)))
        held = next(filter(None, popped), None)  # the chunk's entry, which each row holds
        if held is not None:
            held[0].finish(held[1])

    def _failed(self, rid: int, exc: BaseException, log_id: str | None) -> None:
        if isinstance(exc, ServeError):
            self.outbox.add("results", (rid, error_fields(exc), 0))
        else:
            log.error("request %s failed", log_id or rid, exc_info=exc)
            self.outbox.add("results", (rid, (500, "internal_error", "internal error", None), 0))
