"""The device process's admission of a front end's requests (app/intake.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from app.errors import ServeError
from app.intake import admit_rows
from app.pending import RowsAnswer
from app.runtime import InferenceService
from tests.unit.test_bridge import GatedRows
from tests.unit.test_runtime import running

pytestmark = pytest.mark.asyncio


async def admit(service: InferenceService, rows: np.ndarray, deadlines: list[float]
                ) -> tuple[Any, list[Any], list[list[int] | None], asyncio.Future[Any]]:
    """``admit_rows`` of ``rows`` at the default level: (the chunk's request, the refusals,
    each ``answer_for``'s places, the chunk's answer once it is set)."""
    model = service.repository.get()
    answered: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    places: list[list[int] | None] = []

    def answer_for(kept: list[int] | None) -> RowsAnswer:
        places.append(kept)
        ids = range(len(rows)) if kept is None else kept
        return RowsAnswer(lambda a: answered.set_result(a.result()), ids, [None] * len(ids))

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
        results = await asyncio.wait_for(answered, 30)
        np.testing.assert_array_equal(np.stack(results), 2 * rows[[0, 2]])


async def test_rows_all_admitted_are_answered_as_one_block() -> None:
    """One-row requests that all pass the gate queue as one chunk (``answer_for(None)``), and
    rows computed in one model call come back as one array of their results."""
    async with running(GatedRows(), max_batch_size=8, queue_capacity=16,
                       max_instances=8) as service:
        rows = np.arange(8, dtype=np.float32).reshape(4, 2)
        now = time.monotonic()
        request, refused, places, answered = await admit(service, rows, [now + 30.0] * 4)
        assert request is not None and request.count == 4 and not refused and places == [None]
        results = await asyncio.wait_for(answered, 30)
        assert type(results) is np.ndarray
        np.testing.assert_array_equal(results, 2 * rows)
