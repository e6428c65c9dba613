"""ModelQueue: janus in from the loop, a staging area the device threads take from."""

from __future__ import annotations

import asyncio
import threading

import pytest

from app.batching import PendingItem, PendingRequest
from app.queues import ModelQueue

pytestmark = pytest.mark.asyncio


def items(n: int) -> list[PendingItem]:
    loop = asyncio.get_running_loop()
    request = PendingRequest(loop.create_future(), n, 1e9, 0.0)
    return [PendingItem(request, i, float(i)) for i in range(n)]


async def test_head_shows_the_oldest_without_taking_it() -> None:
    q = ModelQueue(capacity=8)
    q.open()
    assert q.head() is None
    for item in items(3):
        q.put(item)
    assert q.head().data == 0.0 and q.depth == 3  # type: ignore[union-attr]
    assert [i.data for i in q.take(2)] == [0.0, 1.0]
    assert q.depth == 1
    assert [i.data for i in q.take(5)] == [2.0] and q.take(5) == []


async def test_depth_counts_staged_items_so_the_capacity_holds() -> None:
    q = ModelQueue(capacity=2)
    q.open()
    for item in items(2):
        q.put(item)
    q.head()  # one item moves to the staging area
    assert q.depth == 2


async def test_a_shut_down_queue_still_gives_what_it_holds() -> None:
    q = ModelQueue(capacity=4)
    q.open()
    for item in items(2):
        q.put(item)
    q.shutdown()
    assert not q.finished
    assert len(q.take(4)) == 2 and q.take(4) == [] and q.finished
    await q.wait_closed()


async def test_two_device_threads_take_each_item_once() -> None:
    q = ModelQueue(capacity=2000)
    q.open()
    for item in items(2000):
        q.put(item)
    taken: list[list[float]] = [[], []]

    def drain(into: list[float]) -> None:
        while batch := q.take(7):
            into.extend(i.data for i in batch)

    threads = [threading.Thread(target=drain, args=(t,)) for t in taken]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken[0] + taken[1]) == [float(i) for i in range(2000)]


async def test_an_urgent_item_overtakes_a_backlog_of_less_urgent_ones() -> None:
    q = ModelQueue(capacity=16, levels=3)
    q.open()
    loop = asyncio.get_running_loop()
    for value, level in ((1.0, 3), (2.0, 3), (3.0, 2), (4.0, 1), (5.0, 3), (6.0, 1)):
        q.put(PendingItem(PendingRequest(loop.create_future(), 1, 1e9, 0.0, level), 0, value))
    assert q.depth == 6 and q.depth_through(1) == 2 and q.depth_through(2) == 3
    assert q.head().data == 4.0  # type: ignore[union-attr]
    assert [i.data for i in q.take(3)] == [4.0, 6.0, 3.0]  # level 1, then 2, in arrival order
    assert q.depth_through(1) == 0 and q.depth == 3
    assert [i.data for i in q.take(9)] == [1.0, 2.0, 5.0]
