"""A front end's link (app/frontend/link.py) against a scripted device process: each request
is answered once, by the device, by its deadline (then the device is told to drop it), or 503
when the device process goes away."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest

from app import wire
from app.asks import Asked, Replied
from app.errors import DeadlineExceeded, Relayed, Unavailable
from app.frontend.link import DeviceLink
from app.links import Inbox, connect
from app.snapshot import Snapshot
from tests.conftest import WAIT_S

pytestmark = pytest.mark.asyncio


@asynccontextmanager
async def linked() -> AsyncIterator[tuple[DeviceLink, Inbox, asyncio.Transport]]:
    """A link and the device's end of its socket, the first snapshot sent."""
    ours, theirs = socket.socketpair()
    inbox, transport = await connect(theirs)
    transport.writelines(wire.encode({"models": [Snapshot()]}))
    link = DeviceLink()
    front_inbox, front_transport = await connect(ours)
    await link.open(front_inbox, front_transport)
    try:
        yield link, inbox, transport
    finally:
        link.close()
        for end in (transport, front_transport):
            end.close()


async def received(inbox: Inbox, kind: str) -> list[Any]:
    """The entries of ``kind`` in the next message that has any."""
    while True:
        message = await asyncio.wait_for(inbox.read(), 10)
        if kind in message:
            return list(message[kind])


def submit(link: DeviceLink, timeout_s: float) -> Any:
    """One request of one row for model m version 1, at level 1."""
    return link.submit(("m", "1", 1), time.monotonic() + timeout_s, "log-1", [np.ones(2)])


async def sent_ids(inbox: Inbox) -> list[int]:
    """The ids of the requests in the next message that has any, in their order."""
    return [e[0] for *_, entries in await received(inbox, "requests") for e in entries]


async def test_results_answer_a_request_and_its_deadline_is_then_off() -> None:
    async with linked() as (link, device, to_front):
        request = submit(link, WAIT_S)
        rid, = await sent_ids(device)
        to_front.writelines(wire.encode({"results": [(rid, None, 1)],
                                    "results_values": wire.pack([np.full(3, 7.0)])}))
        assert (await request.future)[0].tolist() == [7.0] * 3
        assert request.timer is not None and request.timer.cancelled()  # never a 504 now
        assert not link.waiting


async def test_past_its_deadline_a_request_is_answered_504_and_dropped_there() -> None:
    async with linked() as (link, device, to_front):
        request = submit(link, 0.05)
        rid, = await sent_ids(device)
        with pytest.raises(DeadlineExceeded):
            await request.future
        assert await received(device, "cancel") == [rid] and not link.waiting
        # an answer the device sends meanwhile changes nothing
        to_front.writelines(wire.encode({"results": [(rid, (503, "busy", "full", 1), 0)]}))
        await asyncio.sleep(0.05)
        assert isinstance(request.future.exception(), DeadlineExceeded)


async def test_a_request_whose_client_left_is_dropped_by_the_device_process() -> None:
    """The request path's disconnect watch cancels the request's future, then drops it: the
    device process is told to drop its items, whichever came first; an answered request is
    not dropped there."""
    async with linked() as (link, device, to_front):
        left, cancelled_first, answered = (submit(link, 30) for _ in range(3))
        rids = await sent_ids(device)
        link.drop(left)  # its caller gave up waiting
        cancelled_first.future.cancel()  # the disconnect watch's cancel
        link.drop(cancelled_first)
        assert await received(device, "cancel") == rids[:2]
        to_front.writelines(wire.encode({"results": [(rids[2], None, 1)],
                                    "results_values": wire.pack([np.ones(1)])}))
        await answered.future
        link.drop(answered)
        link.send("acked", 0)  # a message after it: no cancel with it
        message = await asyncio.wait_for(device.read(), 10)
        assert "cancel" not in message and not link.waiting


async def test_a_refusal_is_relayed_and_a_lost_device_answers_the_rest_503() -> None:
    async with linked() as (link, device, to_front):
        refused = submit(link, 30)
        waiting = submit(link, 30)
        first, _ = await sent_ids(device)
        to_front.writelines(wire.encode({"results": [(first, (503, "busy", "full", 2), 0)]}))
        with pytest.raises(Relayed) as busy:
            await refused.future
        assert (busy.value.status, busy.value.retry_after_s) == (503, 2)
        to_front.close()
        with pytest.raises(Unavailable) as gone:
            await waiting.future
        assert gone.value.type == "unhealthy" and link.gone


async def test_a_request_answered_as_one_block_gets_the_block() -> None:
    async with linked() as (link, device, to_front):
        requests = [submit(link, 30) for _ in range(2)]
        rids = await sent_ids(device)
        blocks = [np.full((3, 2), i, dtype=np.float32) for i in range(2)]
        to_front.writelines(wire.encode({"block": rids[::-1], "block_values": wire.pack(blocks)}))
        answers = [await r.future for r in requests]
        assert [a.tolist() for a in answers] == [b.tolist() for b in blocks[::-1]]
        assert all(type(a) is np.ndarray for a in answers) and not link.waiting


async def test_one_row_requests_answered_as_one_block_each_get_their_row() -> None:
    async with linked() as (link, device, to_front):
        requests = [submit(link, 30) for _ in range(3)]
        rids = await sent_ids(device)
        assert len(rids) == 3  # one group: one model version and level
        block = np.arange(6, dtype=np.float32).reshape(3, 2)
        to_front.writelines(wire.encode({"rows": [rids[::-1]], "rows_values": wire.pack([block])}))
        answers = [await r.future for r in requests]
        assert [[row.tolist() for row in a] for a in answers] == [[[4.0, 5.0]], [[2.0, 3.0]],
                                                                   [[0.0, 1.0]]]
        assert not link.waiting and all(r.timer.cancelled() for r in requests)


async def test_a_snapshot_is_acknowledged_once_what_its_callbacks_make_is_made() -> None:
    """A front end acknowledges a snapshot (a load's answer waits for every front end's) only
    once it can serve what it names: a handler made on a thread is awaited first."""
    async with linked() as (link, device, to_front):
        made: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        link.on_snapshot.append(lambda snap: made if snap.names else None)
        to_front.writelines(wire.encode({"models": [Snapshot()], "ack": [1]}))
        assert await received(device, "acked") == [1]  # nothing made: at once
        to_front.writelines(wire.encode({"models": [Snapshot(names=["m"])], "ack": [2]}))
        await asyncio.sleep(0.05)
        to_front.writelines(wire.encode({"ack": [3]}))  # a scrape's: not held
        assert await received(device, "acked") == [3]
        made.set_result(None)
        assert await received(device, "acked") == [2]


async def test_an_ask_is_answered_by_its_reply_and_503_once_the_device_is_gone() -> None:
    """``ask`` sends the request and resolves with the reply under its token, in whichever
    order replies come; a reply nobody waits for (its caller timed out) changes nothing."""
    async with linked() as (link, device, to_front):
        first = asyncio.ensure_future(link.ask(Asked("GET", "/a", b"/a", b"", [], None, b"")))
        second = asyncio.ensure_future(link.ask(Asked("GET", "/b", b"/b", b"", [], None, b"")))
        asked = await received(device, "ask")
        assert [request.path for _, request in asked] == ["/a", "/b"]
        (one, _), (two, _) = asked
        to_front.writelines(wire.encode({"replied": [(two, Replied(404, [], b"b")),
                                                     (one, Replied(200, [], b"a")),
                                                     (999, Replied(200, [], b"late"))]}))
        assert (await first).body == b"a" and (await second) == Replied(404, [], b"b")
        waiting = asyncio.ensure_future(link.ask(Asked("GET", "/c", b"/c", b"", [], None, b"")))
        await received(device, "ask")
        to_front.close()
        with pytest.raises(Unavailable) as gone:
            await waiting
        assert gone.value.type == "unhealthy"
        with pytest.raises(Unavailable):
            await link.ask(Asked("GET", "/d", b"/d", b"", [], None, b""))
