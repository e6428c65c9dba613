"""app/tasks.py: background tasks kept until done."""

from __future__ import annotations

import asyncio
import logging

import pytest

from app.tasks import Background, resolver

LOG = logging.getLogger("batchserve.test")


@pytest.mark.asyncio
async def test_wait_returns_once_every_started_task_has_ended() -> None:
    background = Background(LOG)
    gate = asyncio.Event()
    ran: list[int] = []

    async def job(n: int) -> None:
        await gate.wait()
        ran.append(n)

    for n in range(3):
        background.start(job(n), f"job {n}", failed=lambda: ran.append(-1))
    await asyncio.sleep(0)
    assert ran == []
    gate.set()
    await background.wait()
    assert sorted(ran) == [0, 1, 2]
    await background.wait()  # nothing left: returns at once


@pytest.mark.asyncio
async def test_a_tasks_error_is_logged_in_one_line_and_raised_by_wait(
        caplog: pytest.LogCaptureFixture) -> None:
    background = Background(LOG)
    told: list[str] = []

    async def fails() -> None:
        raise ValueError("boom")

    with caplog.at_level(logging.ERROR, LOG.name):
        background.start(fails(), "the fuse", failed=lambda: told.append("failed"))
        with pytest.raises(ValueError, match="boom"):
            await background.wait()
    assert [r.getMessage() for r in caplog.records] == ["the fuse failed: ValueError: boom"]
    assert told == ["failed"]


@pytest.mark.asyncio
async def test_a_resolver_resolves_its_future_once_unless_it_was_cancelled() -> None:
    loop = asyncio.get_running_loop()
    future, cancelled = loop.create_future(), loop.create_future()
    resolve = resolver(future)
    resolve()
    resolve()  # a second call changes nothing
    assert future.result() is None
    cancelled.cancel()
    resolver(cancelled)()  # no InvalidStateError
    assert cancelled.cancelled()
