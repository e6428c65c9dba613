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
from tests.unit.test_bridge import GatedRows
from tests.unit.test_runtime import running

pytestmark = pytest.mark.asyncio


async def test_rows_admitted_around_a_refusal_queue_as_one_chunk_of_theirs() -> None:
    """Three one-row requests, the middle one past its deadline: it is refused at once (the
    deadline-aware refusal), the other two queue as one chunk of their rows, one request
    standing for both, answered with their rows' results in order."""
    async with running(GatedRows(), max_batch_size=8, queue_capacity=16,
                       max_instances=8) as service:
        model = service.repository.get()
        rows = np.arange(6, dtype=np.float32).reshape(3, 2)
        answered: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        places: list[list[int]] = []

        def answer_for(kept: list[int]) -> RowsAnswer:
            places.append(kept)
            return RowsAnswer(lambda a: answered.set_result(a.result()), [(i, None) for i in kept])

        now = time.monotonic()
        outcomes = admit_rows(model, model.settings.default_level, rows,
                              [now + 30.0, now - 1.0, now + 30.0], answer_for)
        assert isinstance(outcomes[1], ServeError) and outcomes[1].status == 503
        assert outcomes[0] is outcomes[2] and places == [[0, 2]]
        assert model.in_flight == 2
        results = await asyncio.wait_for(answered, 30)
        np.testing.assert_array_equal(np.stack(results), 2 * rows[[0, 2]])
