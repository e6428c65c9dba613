"""What a batch did, handed from a device thread back to the event loop: each item's result,
written into its request (``BatchReport.answer``), and what the batch teaches the metrics and
the cost model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.errors import ServeError
from app.pending import DROPPED, PendingItem, RowsAnswer


def per_item(items: list[PendingItem], results: Sequence[Any]
             ) -> list[tuple[PendingItem, Any]]:
    """Each item with its result, from one result a row: a chunk's is its rows' (a block of
    a tensor's rows, or a list)."""
    if len(results) == len(items):  # every item a single row
        return list(zip(items, results, strict=True))
    paired = []
    at = 0
    for item in items:
        n = item.rows
        paired.append((item, results[at] if n == 1 else results[at:at + n]))
        at += n
    return paired


@dataclass
class BatchReport:
    """What one batch did, handed from a device thread to the event loop with its results."""

    device: str
    # Each item's result (a chunk's: a list of its rows' results), or a ServeError for it.
    results: list[tuple[PendingItem, Any]]
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

    def answer(self) -> list[float]:
        """Write each result into its request, and resolve each request whose every item is
        in (or the first to fail) on the event loop; hand the rows of a chunk of one-row
        requests to its answer as they are. The queue waits of the answered items (one a
        row)."""
        waits = []
        results, at, end = self.results, 0, len(self.results)
        while at < end:
            item, value = results[at]
            at += 1
            request = item.request
            future = request.future
            if future.done():
                continue
            failed = isinstance(value, ServeError) or value is DROPPED
            wait = self.started_at - request.enqueued_at
            if request.deadlines is not None:  # one-row requests: answered as they are done
                assert isinstance(future, RowsAnswer)
                n = item.rows
                if n == 1 and not failed:  # with the next rows of its chunk, one run
                    run = _run(results, at - 1)
                    if len(run) > 1:
                        value, n = run, len(run)
                        at += n - 1
                future.set_rows(item.index, n, value)
                if not failed:
                    waits.extend([wait] * n)
                request.remaining -= n
                if request.remaining == 0:
                    future.set_result(None)
                continue
            if failed:  # the request's first item to fail fails it
                future.set_exception(value)
                continue
            if (1 < item.rows == request.remaining == len(request.results)
                    and type(value) is np.ndarray):  # all of its rows in one chunk: one block
                waits.extend([wait] * item.rows)
                request.remaining = 0
                future.set_result(value)
                continue
            if item.rows == 1:
                request.results[item.index] = value
                waits.append(wait)
            else:  # a chunk: its rows' results, and a wait for each (the metric is per item)
                request.results[item.index:item.index + item.rows] = value
                waits.extend([wait] * item.rows)
            request.remaining -= item.rows
            if request.remaining == 0:
                future.set_result(request.results)
        return waits


def _run(results: list[tuple[PendingItem, Any]], at: int) -> list[Any]:
    """The results from ``results[at]`` on, a row an item, while they are the next rows of
    that item's request and none failed."""
    request, index = results[at][0].request, results[at][0].index
    run = []
    for i in range(at, len(results)):
        item, value = results[i]
        if (item.request is not request or item.index != index or item.rows != 1
                or isinstance(value, ServeError) or value is DROPPED):
            break
        run.append(value)
        index += 1
    return run
