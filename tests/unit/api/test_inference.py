"""The disconnect watch of the request path (app/api/inference.py): a client that leaves lets
its request go, in the decode's wait or once queued; a cancel from elsewhere (a stop) stays
one."""

from __future__ import annotations

import asyncio
import gc
from types import SimpleNamespace
from typing import Any

import pytest

from app.api.inference import WATCH_AFTER_S, DisconnectWatch

pytestmark = pytest.mark.asyncio


class Client:
    """An ASGI receive whose client leaves when told (``leave``)."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()

    def leave(self) -> None:
        self.gone.set()

    async def receive(self) -> dict[str, Any]:
        await self.gone.wait()
        return {"type": "http.disconnect"}


async def request(client: Client, queued: asyncio.Future[Any] | None) -> str:
    """A request that waits (as on a decode in the pool, or, given ``queued``, on its queued
    answer), its client leaving meanwhile. What it came to."""
    watch = DisconnectWatch(client.receive)
    try:
        if queued is not None:
            watch.queued(SimpleNamespace(future=queued))  # type: ignore[arg-type]
            await queued
        else:
            await asyncio.sleep(60)  # the decode's wait
        return "answered"
    except asyncio.CancelledError:
        if watch.let_go():
            return "let go"
        raise
    finally:
        watch.close()


async def leaving(queued: asyncio.Future[Any] | None = None, outside: bool = False) -> Any:
    """What a request comes to whose client leaves once it is watched; ``outside``: its task
    is cancelled from elsewhere (a stop) at the same moment."""
    client = Client()
    task = asyncio.ensure_future(request(client, queued))
    await asyncio.sleep(WATCH_AFTER_S * 3)  # the watch has started
    client.leave()
    if outside:
        task.cancel()
    return await asyncio.gather(task, return_exceptions=True)


async def test_a_client_that_leaves_lets_its_request_go_while_decoding_or_queued() -> None:
    assert await leaving() == ["let go"]
    queued: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    assert await leaving(queued) == ["let go"] and queued.cancelled()


async def test_a_cancel_from_elsewhere_stays_a_cancel() -> None:
    for queued in (None, asyncio.get_running_loop().create_future()):
        outcome, = await leaving(queued, outside=True)
        assert isinstance(outcome, asyncio.CancelledError)


async def test_a_request_answered_at_once_starts_no_watch() -> None:
    client = Client()
    watch = DisconnectWatch(client.receive)
    answered: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    answered.set_result([1])
    watch.queued(SimpleNamespace(future=answered))  # type: ignore[arg-type]
    await asyncio.sleep(WATCH_AFTER_S * 3)
    assert watch._task is None and not watch.let_go()
    watch.close()


async def test_a_watch_that_started_leaves_the_garbage_collector_nothing() -> None:
    """A request answered after its watch started (its answer took longer than
    ``WATCH_AFTER_S``): the watch's task, cancelled, ends without a reference cycle (its
    CancelledError's frames held the watch, which held the task), so what the request made goes
    as it ends, not at a later collection (the front ends under load had every request's
    task, futures and frames to collect)."""
    gc.collect()
    gc.disable()
    try:
        watch = DisconnectWatch(Client().receive)
        await asyncio.sleep(WATCH_AFTER_S * 3)
        started = watch._task
        assert started is not None
        watch.close()
        await asyncio.wait([started])  # as the server does: nothing asks for its outcome
        assert started.cancelled()
        del watch, started
        assert gc.collect() == 0
    finally:
        gc.enable()

