"""The device process's admission of a front end's requests (app/intake.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from app.errors import ServeError
from app.intake import admit_all, admit_rows
from app.pending import Answer, PendingRequest, RowsAnswer
from app.runtime import InferenceService
from tests.unit.test_bridge import GatedRows
from tests.unit.test_runtime import running

pytestmark = pytest.mark.asyncio


async def admit(service: InferenceService, rows: np.ndarray, deadlines: list[float]
                ) -> tuple[Any, list[Any], list[list[int] | None], asyncio.Future[Any]]:
    """``admit_rows`` of ``rows`` at the default level: (the chunk's request, the refusals,
    each ``answer_for``'s places, and once every row is answered, the runs of rows it was
    answered in: (first row, rows, their results))."""
    model = service.repository.get()
    answered: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    places: list[list[int] | None] = []
    parts: list[tuple[int, int, Any]] = []

    def answer_for(kept: list[int] | None) -> RowsAnswer:
        places.append(kept)
        ids = range(len(rows)) if kept is None else kept
        return RowsAnswer(lambda a: answered.set_result(parts),
                          lambda a, at, n, value: parts.append((at, n, value)),
                          ids, [None] * len(ids))

    request, refused = admit_rows(model, model.settings.default_level, rows, deadlines,
                                  answer_for)
    return request, refused, places, answered


async def test_rows_admitted_around_a_refusal_queue_as_one_chunk_of_theirs() -> None:
    """Three one-row requests, the middle one past its deadline: it is refused at once (the
    deadline-aware refusal), the other two queue as one chunk of their rows, one request
    standing for both, answered with their rows' results in order."""
    async with running(GatedRows(), max_batch_size=8, queue_capacity=16,
                       max_instances=8) as service:
        rows = np.arange(6, dtype=np.float32).reshape(3, 2)
        now = time.monotonic()
        request, refused, places, answered = await admit(service, rows,
                                                         [now + 30.0, now - 1.0, now + 30.0])
        (place, refusal), = refused
        assert place == 1 and isinstance(refusal, ServeError) and refusal.status == 503
        assert request is not None and request.count == 2 and places == [[0, 2]]
        assert service.repository.get().in_flight == 2
        (at, n, results), = await asyncio.wait_for(answered, 30)
        assert (at, n) == (0, 2)
        np.testing.assert_array_equal(results, 2 * rows[[0, 2]])


async def test_rows_all_admitted_are_answered_as_one_block() -> None:
    """One-row requests that all pass the gate queue as one chunk (``answer_for(None)``), and
    rows computed in one model call come back as one array of their results."""
    async with running(GatedRows(), max_batch_size=8, queue_capacity=16,
                       max_instances=8) as service:
        rows = np.arange(8, dtype=np.float32).reshape(4, 2)
        now = time.monotonic()
        request, refused, places, answered = await admit(service, rows, [now + 30.0] * 4)
        assert request is not None and request.count == 4 and not refused and places == [None]
        (at, n, results), = await asyncio.wait_for(answered, 30)
        assert (at, n) == (0, 4) and type(results) is np.ndarray
        np.testing.assert_array_equal(results, 2 * rows)


async def requests_of(rows: np.ndarray, deadlines: list[float]
                      ) -> tuple[list[tuple[Any, float, Answer]], list[asyncio.Future[Any]]]:
    """One-item requests of ``rows`` for ``admit_all``, and a future for each one's answer."""
    loop = asyncio.get_running_loop()
    answered = [loop.create_future() for _ in deadlines]
    requests = [([row], deadline, Answer(lambda a, f=f: f.set_result(a.result()), i))
                for i, (row, deadline, f) in enumerate(zip(rows, deadlines, answered,
                                                           strict=True))]
    return requests, answered


async def test_one_item_requests_that_all_pass_are_admitted_at_once() -> None:
    async with running(GatedRows(), max_batch_size=8, queue_capacity=16,
                       max_instances=8) as service:
        model = service.repository.get()
        rows = np.arange(8, dtype=np.float32).reshape(4, 2)
        requests, answered = await requests_of(rows, [time.monotonic() + 30.0] * 4)
        outcomes = admit_all(model, model.settings.default_level, requests)
        assert all(isinstance(o, PendingRequest) and o.count == 1 for o in outcomes)
        assert model.in_flight == 4
        results = await asyncio.wait_for(asyncio.gather(*answered), 30)
        np.testing.assert_array_equal(np.stack([r[0] for r in results]), 2 * rows)


async def test_one_item_requests_refused_as_one_by_one_admission_refuses_them() -> None:
    """Where one of them would miss its deadline, none is admitted at once: each passes the
    gate in order, and only that one is refused (the deadline-aware refusal)."""
    async with running(GatedRows(), max_batch_size=8, queue_capacity=16,
                       max_instances=8) as service:
        model = service.repository.get()
        rows = np.arange(6, dtype=np.float32).reshape(3, 2)
        now = time.monotonic()
        requests, answered = await requests_of(rows, [now + 30.0, now - 1.0, now + 30.0])
        first, refused, last = admit_all(model, model.settings.default_level, requests)
        assert isinstance(first, PendingRequest) and isinstance(last, PendingRequest)
        assert isinstance(refused, ServeError) and refused.status == 503
        assert model.in_flight == 2
        results = await asyncio.wait_for(asyncio.gather(answered[0], answered[2]), 30)
        np.testing.assert_array_equal(np.stack([r[0] for r in results]), 2 * rows[[0, 2]])
