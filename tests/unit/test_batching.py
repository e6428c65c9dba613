"""The batching policy and collector, driven by a fake clock: no sleeping."""

from __future__ import annotations

import asyncio

import pytest

from app.batching import (
    ArrivalRate,
    BatchPolicy,
    PendingItem,
    PendingRequest,
    collect_batch,
    group_by,
    split_live,
)
from tests.fakes import FakeClock, FakeQueue

POLICY = BatchPolicy(max_batch_size=4, max_wait_s=0.005)


class _Future:
    """Stands in for an asyncio future: the collector only calls done()."""

    def __init__(self) -> None:
        self.cancelled = False

    def done(self) -> bool:
        return self.cancelled


def request(at: float, size: int = 1, deadline: float = 1e9) -> PendingRequest:
    return PendingRequest(_Future(), size, deadline, at)  # type: ignore[arg-type]


def item(at: float, deadline: float = 1e9) -> PendingItem:
    return PendingItem(request(at, deadline=deadline), 0, at)


def setup(arrivals: list[float], now: float = 100.0) -> tuple[FakeClock, FakeQueue]:
    clock = FakeClock(now)
    q = FakeQueue(clock)
    for at in arrivals:
        q.add(at, item(at))
    return clock, q


def test_full_batch_leaves_at_once() -> None:
    clock, q = setup([100.0] * 6)
    batch = collect_batch(q, POLICY, 4, ArrivalRate(), lambda: 6, clock, clock.sleep)
    assert len(batch) == 4
    assert clock.now == 100.0  # no waiting at all


def test_partial_batch_leaves_at_the_wait_deadline() -> None:
    clock, q = setup([100.0, 100.0001])  # arrivals that fast make waiting worth it to the end
    batch = collect_batch(q, POLICY, 4, ArrivalRate(), lambda: 10, clock, clock.sleep)
    assert len(batch) == 2
    assert clock.now == pytest.approx(100.005)  # first item + max_wait


def test_items_arriving_within_the_budget_join() -> None:
    clock, q = setup([100.0, 100.001, 100.002, 100.003, 100.009])
    batch = collect_batch(q, POLICY, 4, ArrivalRate(), lambda: 10, clock, clock.sleep)
    assert [i.data for i in batch] == [100.0, 100.001, 100.002, 100.003]
    assert clock.now == pytest.approx(100.003)  # left as soon as it was full


def test_no_wait_when_the_next_arrival_is_predicted_too_late() -> None:
    # Requests every 2 ms; at 100.004 only 1 ms of budget is left, so it goes without waiting.
    clock, q = setup([100.0, 100.002, 100.004, 100.0045])
    batch = collect_batch(q, POLICY, 4, ArrivalRate(), lambda: 10, clock, clock.sleep)
    assert [i.data for i in batch] == [100.0, 100.002, 100.004]
    assert clock.now == pytest.approx(100.004)


def test_lone_request_is_not_kept_waiting() -> None:
    clock, q = setup([100.0])
    batch = collect_batch(q, POLICY, 4, ArrivalRate(), lambda: 1, clock, clock.sleep)
    assert len(batch) == 1
    assert clock.now == 100.0


def test_all_in_flight_requests_in_batch_means_go() -> None:
    clock, q = setup([100.0, 100.0, 100.0])
    batch = collect_batch(q, POLICY, 4, ArrivalRate(), lambda: 3, clock, clock.sleep)
    assert len(batch) == 3
    assert clock.now == 100.0


def test_sparse_arrivals_do_not_wait() -> None:
    rate = ArrivalRate()
    for at in (90.0, 92.0, 94.0):  # one request every 2 s: far longer than the 5 ms budget
        rate.observe(request(at))
    clock, q = setup([100.0, 100.003])
    batch = collect_batch(q, POLICY, 4, rate, lambda: 5, clock, clock.sleep)
    assert len(batch) == 1
    assert clock.now == 100.0


def test_a_known_rate_fills_the_batch_by_napping_not_by_a_wake_per_item() -> None:
    rate = ArrivalRate()
    for at in (99.997, 99.998, 99.999):  # one request per millisecond
        rate.observe(request(at))
    clock, q = setup([100.0, 100.001, 100.002, 100.003, 100.004])
    batch = collect_batch(q, POLICY, 4, rate, lambda: 10, clock, clock.sleep)
    assert [i.data for i in batch] == [100.0, 100.001, 100.002, 100.003]
    assert clock.now == pytest.approx(100.003)  # one nap, until the fourth was due
    assert clock.naps == 1  # not one wake-up per item


def test_a_nap_expects_no_more_arrivals_than_requests_in_flight() -> None:
    rate = ArrivalRate()
    for at in (99.997, 99.998, 99.999):
        rate.observe(request(at))
    clock, q = setup([100.0, 100.0005])
    # Two requests in flight, so one more can join: nap one gap, not three (the free places).
    batch = collect_batch(q, POLICY, 4, rate, lambda: 2, clock, clock.sleep)
    assert [i.data for i in batch] == [100.0, 100.0005]
    assert clock.now == pytest.approx(100.001)


def test_an_empty_source_gives_an_empty_batch() -> None:
    clock, q = setup([100.5])  # not arrived yet
    assert collect_batch(q, POLICY, 4, ArrivalRate(), lambda: 1, clock, clock.sleep) == []
    assert clock.now == 100.0


def test_effective_limit_caps_the_batch() -> None:
    clock, q = setup([100.0] * 6)
    assert len(collect_batch(q, POLICY, 2, ArrivalRate(), lambda: 6, clock, clock.sleep)) == 2


def test_wait_budget_is_pure() -> None:
    assert POLICY.wait_budget(4, 100.0, 100.0) == 0.0
    assert POLICY.wait_budget(1, 100.0, 100.002) == pytest.approx(0.003)
    assert POLICY.wait_budget(1, 100.0, 100.006) == 0.0
    waits = POLICY.wait_budget(1, 100.0, 100.0, gap_s=0.001, others_in_flight=3)
    assert waits == pytest.approx(0.005)
    assert POLICY.wait_budget(1, 100.0, 100.0, gap_s=0.010, others_in_flight=3) == 0.0
    assert POLICY.wait_budget(1, 100.0, 100.0, gap_s=0.001, others_in_flight=0) == 0.0


def test_arrival_rate_counts_requests_not_items() -> None:
    rate = ArrivalRate(alpha=1.0)
    a, b = request(10.0, size=3), request(10.5)
    for r in (a, a, a, b):
        rate.observe(r)
    assert rate.gap_s == pytest.approx(0.5)


def test_expired_and_cancelled_items_are_split_off() -> None:
    live = item(100.0)
    expired = item(100.0, deadline=100.5)
    cancelled = item(100.0)
    cancelled.request.future.cancelled = True  # type: ignore[attr-defined]
    keep, drop = split_live([live, expired, cancelled], now=101.0)
    assert keep == [live]
    assert drop == [expired, cancelled]


def test_group_by_keeps_order_within_groups() -> None:
    groups = group_by([(1, "a"), (2, "b"), (1, "c")], key=lambda p: p[0])
    assert groups == [[(1, "a"), (1, "c")], [(2, "b")]]


@pytest.mark.asyncio
async def test_pending_request_starts_with_empty_slots() -> None:
    fut: asyncio.Future[list[object]] = asyncio.get_running_loop().create_future()
    r = PendingRequest(fut, 3, 1.0, 0.0)
    assert r.results == [None, None, None] and r.remaining == 3
    assert r.abandoned(2.0) and not r.abandoned(0.5)
