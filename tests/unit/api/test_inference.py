"""The request path's parts (app/api/inference.py): its disconnect watch (a client that leaves
lets its request go, in the decode's wait or once queued; a cancel from elsewhere, a stop, stays
one) and its answers (the head and body Starlette's Response would send)."""

from __future__ import annotations

import asyncio
import gc
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.responses import Response

from app.api.inference import WATCH_AFTER_S, Answer, DisconnectWatch

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


async def sent(response: Response) -> list[dict[str, Any]]:
    """The ASGI messages ``response`` sends."""
    messages: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    async def receive() -> dict[str, Any]:
        raise AssertionError("an answer reads nothing")

    await response({"type": "http"}, receive, send)
    return messages


@pytest.mark.parametrize("media_type", ["application/json", "application/octet-stream"])
async def test_an_answer_sends_what_starlettes_response_sends(media_type: str) -> None:
    """The same status, headers (names, values, order) and body as Starlette's Response, with
    and without a header of the protocol's before them."""
    body = b'{"predictions": [[0.5, 1.25]]}'
    assert await sent(Answer(body, media_type.encode())) == await sent(
        Response(body, media_type=media_type))
    first = ((b"inference-header-content-length", b"12"),)
    starlettes = Response(body, media_type=media_type,
                          headers={"Inference-Header-Content-Length": "12"})
    assert await sent(Answer(body, media_type.encode(), first)) == await sent(starlettes)
    assert Answer(body, media_type.encode(), first).headers["content-length"] == str(len(body))
