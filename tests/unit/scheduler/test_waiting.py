"""The batching policy and collector, driven by a fake clock: no sleeping."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import numpy as np
import pytest

from app.pending import PendingItem, PendingRequest, rows_request
from app.scheduler.cost import CostModel
from app.scheduler.waiting import (
    NO_WAIT,
    RETURNING_SHARE,
    ArrivalRate,
    BatchPolicy,
    RecentPeak,
    Wait,
    _closed_loop,
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

    def cancel(self) -> bool:
        self.cancelled = True
        return True


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
    batch = collect_batch(q, POLICY, 4, ArrivalRate(), lambda: 6, clock=clock, nap=q.nap)
    assert len(batch) == 4
    assert clock.now == 100.0  # no waiting at all


def test_partial_batch_leaves_at_the_wait_deadline() -> None:
    clock, q = setup([100.0, 100.0001])  # arrivals that fast make waiting worth it to the end
    batch = collect_batch(q, POLICY, 4, ArrivalRate(), lambda: 10, clock=clock, nap=q.nap)
    assert len(batch) == 2
    assert clock.now == pytest.approx(100.005)  # first item + max_wait


def test_items_arriving_within_the_budget_join() -> None:
    clock, q = setup([100.0, 100.001, 100.002, 100.003, 100.009])
    batch = collect_batch(q, POLICY, 4, ArrivalRate(), lambda: 10, clock=clock, nap=q.nap)
    assert [i.data for i in batch] == [100.0, 100.001, 100.002, 100.003]
    assert clock.now == pytest.approx(100.003)  # left as soon as it was full


def test_no_wait_when_the_next_arrival_is_predicted_too_late() -> None:
    # Requests every 2 ms; at 100.004 only 1 ms of budget is left, so it goes without waiting.
    clock, q = setup([100.0, 100.002, 100.004, 100.0045])
    batch = collect_batch(q, POLICY, 4, ArrivalRate(), lambda: 10, clock=clock, nap=q.nap)
    assert [i.data for i in batch] == [100.0, 100.002, 100.004]
    assert clock.now == pytest.approx(100.004)


def test_lone_request_is_not_kept_waiting() -> None:
    clock, q = setup([100.0])
    batch = collect_batch(q, POLICY, 4, ArrivalRate(), lambda: 1, clock=clock, nap=q.nap)
    assert len(batch) == 1
    assert clock.now == 100.0


def test_all_in_flight_requests_in_batch_means_go() -> None:
    clock, q = setup([100.0, 100.0, 100.0])
    batch = collect_batch(q, POLICY, 4, ArrivalRate(), lambda: 3, clock=clock, nap=q.nap)
    assert len(batch) == 3
    assert clock.now == 100.0


def test_sparse_arrivals_do_not_wait() -> None:
    rate = ArrivalRate()
    for at in (90.0, 92.0, 94.0):  # one request every 2 s: far longer than the 5 ms budget
        rate.observe(request(at))
    clock, q = setup([100.0, 100.003])
    batch = collect_batch(q, POLICY, 4, rate, lambda: 5, clock=clock, nap=q.nap)
    assert len(batch) == 1
    assert clock.now == 100.0


def test_a_known_rate_fills_the_batch_by_napping_not_by_a_wake_per_item() -> None:
    rate = ArrivalRate()
    for at in (99.997, 99.998, 99.999):  # one request per millisecond
        rate.observe(request(at))
    clock, q = setup([100.0, 100.001, 100.002, 100.003, 100.004])
    batch = collect_batch(q, POLICY, 4, rate, lambda: 10, clock=clock, nap=q.nap)
    assert [i.data for i in batch] == [100.0, 100.001, 100.002, 100.003]
    assert clock.now == pytest.approx(100.003)  # one nap, until the fourth was due
    assert clock.naps == 1  # not one wake-up per item


def test_a_nap_expects_no_more_arrivals_than_requests_in_flight() -> None:
    rate = ArrivalRate()
    for at in (99.997, 99.998, 99.999):
        rate.observe(request(at))
    clock, q = setup([100.0, 100.0005])
    # Two requests in flight, so one more can join: it naps for one arrival, not three (the
    # free places), and is woken as soon as that one is in.
    batch = collect_batch(q, POLICY, 4, rate, lambda: 2, clock=clock, nap=q.nap)
    assert [i.data for i in batch] == [100.0, 100.0005]
    assert clock.now == pytest.approx(100.0005) and clock.naps == 1


def test_an_empty_source_gives_an_empty_batch() -> None:
    clock, q = setup([100.5])  # not arrived yet
    assert collect_batch(q, POLICY, 4, ArrivalRate(), lambda: 1, clock=clock, nap=q.nap) == []
    assert clock.now == 100.0


def test_effective_limit_caps_the_batch() -> None:
    clock, q = setup([100.0] * 6)
    assert len(collect_batch(q, POLICY, 2, ArrivalRate(), lambda: 6, clock=clock, nap=q.nap)) == 2


def test_the_decision_is_pure() -> None:
    """No cost known: any arrival the budget holds is worth waiting for (at the recent rate)."""
    assert POLICY.wait_s(4, 0.0, 0.001, 3, None) == NO_WAIT  # full
    assert POLICY.wait_s(1, 0.0, 0.001, 0, None) == NO_WAIT  # nothing else in flight
    assert POLICY.wait_s(1, 0.006, 0.001, 3, None) == NO_WAIT  # idle past max_wait
    assert POLICY.wait_s(1, 0.0, 0.001, 3, None) == (pytest.approx(0.003), 3)  # 1 ms apart
    assert POLICY.wait_s(1, 0.0, 0.010, 3, None) == NO_WAIT  # the next one is due too late
    assert POLICY.wait_s(1, 0.0, None, 3, None) == (pytest.approx(0.0005), 1)  # look again soon


WIDE = BatchPolicy(max_batch_size=32, max_wait_s=0.005)


def flat(n: np.ndarray) -> np.ndarray:
    """A memory-bound model: 8 items cost barely more than 4 (the mlp of the issue)."""
    return 0.0072 + 0.00012 * n


def linear_cost(n: np.ndarray) -> np.ndarray:
    """A compute-bound model: every item costs the same, so sharing a batch saves nothing."""
    return 0.001 * n


def test_waiting_pays_when_a_bigger_batch_costs_little_more() -> None:
    # 4 queued, 4 more in flight (a closed loop of 8), arriving every 0.2 ms
    assert WIDE.wait_s(4, 0.0, 0.0002, 4, flat) == (pytest.approx(4 * 0.0002), 4)  # all four


def test_waiting_does_not_pay_when_every_item_costs_the_same() -> None:
    assert WIDE.wait_s(4, 0.0, 0.0002, 4, linear_cost) == NO_WAIT


def per_batch_and_per_item(n: np.ndarray) -> np.ndarray:
    """A compute-bound model with a fixed cost per batch (MiniLM on a CPU): 6 ms + 1.9 an item."""
    return 0.006 + 0.0019 * n


def test_waiting_pays_when_the_bigger_batch_serves_more_items_per_second() -> None:
    """Eight queued, eight more on their way back (a closed loop of 16 in two halves). Going now
    and serving the others after would finish the sixteen sooner on average, and the halves
    would never meet again: 8 items per 21.2 ms. Waiting serves 16 per 37.2 ms."""
    assert WIDE.wait_s(8, 0.0, 0.0001, 8, per_batch_and_per_item) == (pytest.approx(0.0008), 8)


def test_later_arrivals_are_waited_for_only_if_that_finishes_them_sooner() -> None:
    """An open loop's next request, due in 3.5 ms against a 7.9 ms batch: a batch of 2 would serve
    more items per second, but going now and serving it after finishes the two sooner."""
    assert BatchPolicy(32, 0.010).wait_s(1, 0.0, 0.0035, 3, per_batch_and_per_item) == NO_WAIT


def test_two_clients_taking_turns_are_waited_for_when_their_round_trip_is_short() -> None:
    """Two clients, each served alone while the other's request waits: the arrivals are a batch
    apart, so the gap says the partner is due in 7.9 ms and waiting cannot pay. But it was
    answered a moment ago and comes back in 1 ms: 2 items per 10.8 ms against 1 per 7.9."""
    assert WIDE.wait_s(1, 0.0, 0.0079, 1, per_batch_and_per_item) == NO_WAIT
    assert WIDE.wait_s(1, 0.0, 0.0079, 1, per_batch_and_per_item,
                        returning=(0.001, 0.0)) == (pytest.approx(0.001), 1)
    # 0.4 ms after the answers, the partner is due in 0.6
    assert WIDE.wait_s(1, 0.0, 0.0079, 1, per_batch_and_per_item,
                        returning=(0.001, 0.0004)) == (pytest.approx(0.0006), 1)


def twice_for_two(n: np.ndarray) -> np.ndarray:
    """A model whose batch of 2 costs all but 20 us of two batches of 1 (the mlp on this CPU)."""
    return 0.00428 * n - 0.00002 * (n - 1)


def test_a_returning_client_is_not_waited_for_when_a_pair_costs_two_singles() -> None:
    """Served in turns, each client's request runs while the other's is on its way: the device
    never idles. The partner is due in 10 us, and a pair saves 20 us on paper, but no wait is
    shorter than the shortest nap (0.1 ms): not worth it."""
    assert WIDE.wait_s(1, 0.0, 0.0043, 1, twice_for_two,
                        returning=(0.0003, 0.00029)) == NO_WAIT


def pair_saves_a_little(n: np.ndarray) -> np.ndarray:
    """A batch of 2 costs 0.12 ms less than two batches of 1 (4.2 ms each)."""
    return 0.0042 * n - 0.00012 * (n - 1)


def test_clients_taking_turns_are_not_joined_when_the_round_trip_costs_more_than_it_saves(
) -> None:
    """Two clients whose requests came back together (0.5 ms round trip), the partner due in
    0.1 ms. A pair serves more items per second than the single in hand, but joined, every
    round then idles the device for the whole round trip, 0.5 ms, to save 0.12: taking turns,
    each round trip is hidden behind the other's batch."""
    assert WIDE.wait_s(1, 0.0, 0.0042, 1, pair_saves_a_little,
                        returning=(0.0005, 0.0004)) == NO_WAIT
    # with a round trip shorter than what the pair saves, they join
    assert WIDE.wait_s(1, 0.0, 0.0042, 1, pair_saves_a_little,
                        returning=(0.0001, 0.0)) == (pytest.approx(0.0001), 1)


def test_late_returning_clients_are_waited_for_until_twice_their_round_trip() -> None:
    assert WIDE.wait_s(1, 0.0, 0.0079, 1, per_batch_and_per_item,
                        returning=(0.001, 0.0015)) == (pytest.approx(0.0005), 1)
    assert WIDE.wait_s(1, 0.0, 0.0079, 1, per_batch_and_per_item,
                        returning=(0.001, 0.0021)) == NO_WAIT  # not coming


def test_a_round_trip_as_long_as_an_open_loops_is_not_taken_for_a_closed_loop() -> None:
    """Open-loop arrivals land anywhere between two answers: their 'round trip' is a sizeable
    share of a batch (here 3 ms of 7.9), and the partner is not expected then."""
    assert WIDE.wait_s(1, 0.0, 0.0079, 1, per_batch_and_per_item,
                        returning=(0.003, 0.0028)) == NO_WAIT


def test_the_round_trip_is_measured_from_the_latest_answers_before_each_arrival() -> None:
    rate = ArrivalRate()
    assert rate.returning(100.0) is None
    rate.observe(request(99.0))  # before any answer: no round trip
    for answered, trip in ((100.0, 0.0010), (100.010, 0.0012), (100.020, 0.0009),
                           (100.030, 0.0011)):
        rate.answered(answered)
        rate.observe(request(answered + trip))
    # an arrival from before the latest answer counts from the answer before it
    rate.answered(100.040)
    rate.observe(request(100.0395))
    assert rate.trips == pytest.approx([0.0010, 0.0012, 0.0009, 0.0011, 0.0095])
    trip, since = rate.returning(100.0405)  # type: ignore[misc]
    assert trip == pytest.approx(0.0012)  # the upper quartile
    assert since == pytest.approx(0.0005)


def _wait_one_m_at_a_time(policy: BatchPolicy, size: int, idle_s: float, gap_s: float | None,
                          others: int | None, price: Callable[[float], float] | None,
                          slack_s: float, returning: tuple[float, float] | None) -> Wait:
    """docs/scheduler.md's inequalities, each m more arrivals in turn: what ``wait_s`` decides
    for every m at once."""
    free = policy.max_batch_size - size
    remaining = min(policy.max_wait_s - idle_s, slack_s)
    if free <= 0 or others == 0 or remaining <= 0.0:
        return NO_WAIT
    now_s = price(size) if price is not None else None
    loop = _closed_loop(returning, now_s)
    back = loop[1] if loop is not None else None
    if gap_s is None and back is None:
        return min(remaining, 0.0005), 1
    best = NO_WAIT
    for m in range(1, (free if others is None else min(free, others)) + 1):
        d = m * gap_s if gap_s is not None else float("inf")
        d = d if back is None else min(d, back)
        if d > remaining:
            break
        if price is None or now_s is None:
            best = (d, m)
            continue
        whole = price(size + m)
        together = d + whole
        if together > slack_s:
            break
        if loop is not None and loop[0] + whole >= now_s + price(m):
            continue
        faster = d <= RETURNING_SHARE * now_s and (size + m) * now_s > size * together
        if faster or (size + m) * together < size * now_s + m * (now_s + price(m)):
            best = (d, m)
    return best


def test_every_arrival_count_is_weighed_as_if_one_at_a_time() -> None:
    rng = random.Random(29)
    for _ in range(2000):
        work = sorted(rng.sample(range(1, 300), rng.randint(1, 6)))
        cost = CostModel(work, [rng.uniform(0.0001, 0.01) for _ in work])
        per_item = rng.choice([1, 3])
        limit = rng.choice([4, 32, 256])
        case = (BatchPolicy(limit, rng.choice([0.002, 0.005, 0.02])), rng.randint(0, limit),
                rng.choice([0.0, rng.uniform(0, 0.006)]),
                rng.choice([None, rng.uniform(1e-6, 0.005)]),
                rng.choice([None, 0, rng.randint(0, 300)]))
        slack = rng.choice([float("inf"), rng.uniform(0, 0.02)])
        returning = rng.choice([None, (rng.uniform(1e-5, 0.003), rng.uniform(0, 0.006))])
        priced = rng.random() < 0.9
        policy, size, idle, gap, others = case
        many = (lambda n, c=cost, k=per_item: c.predict_all(n * k)) if priced else None
        one = (lambda n, c=cost, k=per_item: c.predict(n * k)) if priced else None
        got = policy.wait_s(size, idle, gap, others, many, slack, returning)
        want = _wait_one_m_at_a_time(policy, size, idle, gap, others, one, slack, returning)
        assert got[1] == want[1] and got[0] == pytest.approx(want[0])


def test_two_clients_taking_turns_share_a_batch() -> None:
    """The collector: one request queued (it came during the last batch), its partner answered
    at 100.0 and due back 1 ms later; the batch takes both, after one nap."""
    rate = ArrivalRate()
    for answered in (99.96, 99.97, 99.98, 99.99):  # turns: each answer, the other back 1 ms later
        rate.answered(answered)
        rate.observe(request(answered + 0.001))
    rate.answered(100.0)
    clock, q = setup([99.991, 100.001])
    batch = collect_batch(q, WIDE, 32, rate, lambda: 2,
                          lambda items: per_batch_and_per_item, clock=clock, nap=q.nap)
    assert [i.data for i in batch] == [99.991, 100.001]
    assert clock.now == pytest.approx(100.001) and clock.naps == 1


def test_no_wait_when_items_come_slower_than_the_batch_in_hand_is_served() -> None:
    # 4 items per 13.6 ms now; waiting 2 ms per arrival would serve fewer per second
    assert BatchPolicy(32, 0.010).wait_s(4, 0.0, 0.002, 8, per_batch_and_per_item) == NO_WAIT


def test_a_deadline_or_target_too_close_forbids_the_wait() -> None:
    # waiting for m arrivals finishes after 0.2 m + 7.2 + 0.12 (4 + m) ms: two fit in 8.5 ms
    assert WIDE.wait_s(4, 0.0, 0.0002, 4, flat, slack_s=0.0085) == (pytest.approx(0.0004), 2)
    assert WIDE.wait_s(4, 0.0, 0.0002, 4, flat, slack_s=0.0070) == NO_WAIT


def test_the_ceiling_counts_idle_time_not_time_in_the_queue() -> None:
    """Items that queued behind a busy device may still be held a little, if that pays: the
    half-batch trap of the issue (c=8 alternating batches of 4) needs exactly this."""
    rate = ArrivalRate()
    for at in (99.9994, 99.9996, 99.9998):
        rate.observe(request(at))
    clock = FakeClock(100.0)
    q = FakeQueue(clock)
    for at in (99.9800, 99.9802, 99.9804, 99.9806):  # queued 20 ms ago, behind the last batch
        q.add(at, item(at))
    for at in (100.0002, 100.0004, 100.0006, 100.0008):  # the other half, coming back
        q.add(at, item(at))
    batch = collect_batch(q, WIDE, 32, rate, lambda: 8, lambda items: flat, None,
                          clock=clock, nap=q.nap)
    assert len(batch) == 8 and clock.now == pytest.approx(100.0008)


def test_a_latency_target_bounds_the_wait() -> None:
    rate = ArrivalRate()
    for at in (99.9994, 99.9996, 99.9998):
        rate.observe(request(at))
    clock = FakeClock(100.0)
    q = FakeQueue(clock)
    for at in (99.999, 99.999, 99.999, 99.999, 100.0002, 100.0004, 100.0006, 100.0008):
        q.add(at, item(at))
    # the oldest item (1 ms old) must be done within 8.5 ms of arriving: a batch of 4 takes 7.7,
    # so no arrival can join in time
    batch = collect_batch(q, WIDE, 32, rate, lambda: 8, lambda items: flat, 0.0085,
                          clock=clock, nap=q.nap)
    assert len(batch) == 4 and clock.now == 100.0


def test_arrival_rate_counts_requests_not_items() -> None:
    rate = ArrivalRate()
    a, b = request(10.0, size=3), request(10.5)
    for r in (a, a, a, b):
        rate.observe(r)
    assert rate.gap_s == pytest.approx(0.5)


def queued_alone(chunk: PendingRequest, gap_s: float
                 ) -> tuple[FakeClock, FakeQueue, ArrivalRate]:
    """A clock at ``chunk``'s arrival, a queue holding its rows as one item, and arrivals
    ``gap_s`` apart: others would be worth a nap."""
    clock = FakeClock(chunk.enqueued_at)
    q = FakeQueue(clock)
    q.add(chunk.enqueued_at, PendingItem(chunk, 0, np.zeros((chunk.count, 2)), None, chunk.count))
    arriving = ArrivalRate()
    arriving.gaps.extend([gap_s] * arriving.window)
    return clock, q, arriving


def test_a_chunk_of_one_row_requests_counts_as_its_requests() -> None:
    """Four one-row requests queued as one chunk are four arrivals (three gaps of 0 after the
    one before them), and a batch holding the chunk holds four of the four in flight: go."""
    rate = ArrivalRate()
    rate.observe(request(9.0))
    chunk = rows_request(_Future(), [1e9] * 4, 10.0, 1)  # type: ignore[arg-type]
    rate.observe(chunk)
    assert list(rate.gaps) == [1.0, 0.0, 0.0, 0.0]
    clock, q, arriving = queued_alone(chunk, 0.001)
    batch = collect_batch(q, WIDE, 32, arriving, lambda: 4, clock=clock, nap=q.nap)
    assert len(batch) == 1 and clock.naps == 0


def test_a_batch_holding_a_chunk_leaves_by_its_soonest_deadline() -> None:
    """A chunk of two one-row requests, one due 2 ms after it queued and one much later, with
    more requests expected soon: the batch waits for them only until the soonest deadline, not
    the whole 5 ms its other row would allow."""
    chunk = rows_request(_Future(), [100.002, 1e9], 100.0, 1)  # type: ignore[arg-type]
    clock, q, arriving = queued_alone(chunk, 0.0001)
    batch = collect_batch(q, WIDE, 32, arriving, lambda: 10, clock=clock, nap=q.nap)
    assert len(batch) == 1 and clock.naps >= 1
    assert clock.now == pytest.approx(100.002)


def test_the_gap_of_bursty_arrivals_is_the_gap_inside_a_burst() -> None:
    """A closed loop of 8: bursts of 8 arrivals 0.2 ms apart, one burst per 8 ms batch. The
    mean gap (1.2 ms) would say waiting for the burst never pays; the median says 0.2 ms."""
    rate = ArrivalRate()
    for burst in range(4):
        for i in range(8):
            rate.observe(request(100.0 + burst * 0.0094 + i * 0.0002))
    assert rate.gap_s == pytest.approx(0.0002)


def test_the_recent_peak_keeps_a_closed_loops_size_between_its_rounds() -> None:
    """Sixteen clients, all in flight once per round: between rounds (and for the round's
    slowest, 70 ms later) the peak still says sixteen."""
    peak = RecentPeak()
    for round_at in (100.0, 100.07, 100.14):
        for in_flight in range(1, 17):
            peak.note(in_flight, round_at)
        assert peak.value(round_at + 0.069) == 16


def test_the_recent_peak_forgets_within_two_windows() -> None:
    peak = RecentPeak(window_s=1.0)
    peak.note(16, 100.0)
    peak.note(1, 101.2)  # load dropped: a new window, the last one's peak still counts
    assert peak.value(101.5) == 16
    peak.note(1, 102.3)
    assert peak.value(102.4) == 1
    assert peak.value(104.4) == 0  # nothing noted for two windows


def test_expired_and_cancelled_items_are_split_off() -> None:
    live = item(100.0)
    expired = item(100.0, deadline=100.5)
    cancelled = item(100.0)
    cancelled.request.future.cancelled = True  # type: ignore[attr-defined]
    assert split_live([live, expired, cancelled], now=101.0) == ([live], [expired], [cancelled])


def test_a_chunk_of_one_row_requests_splits_into_runs_of_rows_alike() -> None:
    """Rows 0-1 live, 2 past its deadline, 3 cancelled, 4-5 live: five parts, each a view of
    its rows at its place; a chunk whose rows are all live stays whole."""
    deadlines = [1e9, 1e9, 100.5, 1e9, 1e9, 1e9]
    chunk = rows_request(_Future(), deadlines, 100.0, 1)  # type: ignore[arg-type]
    chunk.cancel_row(3)
    data = np.arange(12.0).reshape(6, 2)
    live, expired, cancelled = split_live([PendingItem(chunk, 0, data, None, 6)], now=101.0)
    assert [(i.index, i.rows) for i in live] == [(0, 2), (4, 2)]
    assert [(i.index, i.rows) for i in expired] == [(2, 1)] and expired[0].data.tolist() == [4, 5]
    assert [(i.index, i.rows) for i in cancelled] == [(3, 1)]
    np.testing.assert_array_equal(live[1].data, data[4:])
    whole = PendingItem(chunk, 0, data[:2], None, 2)
    assert split_live([whole], now=101.0) == ([whole], [], [])
    for row in (0, 1, 2, 4, 5):
        chunk.cancel_row(row)
    assert chunk.future.done()  # every row gone: the chunk is cancelled


def test_a_chunk_with_rows_past_their_deadline_and_none_cancelled_splits_too() -> None:
    chunk = rows_request(_Future(), (100.5, 1e9, 1e9), 100.0, 1)  # type: ignore[arg-type]
    data = np.arange(6.0).reshape(3, 2)
    live, expired, cancelled = split_live([PendingItem(chunk, 0, data, None, 3)], now=101.0)
    assert [(i.index, i.rows) for i in expired] == [(0, 1)] and cancelled == []
    assert [(i.index, i.rows) for i in live] == [(1, 2)]
    np.testing.assert_array_equal(live[0].data, data[1:])


def test_group_by_keeps_order_within_groups() -> None:
    groups = group_by([(1, "a"), (2, "b"), (1, "c")], key=lambda p: p[0])
    assert groups == [[(1, "a"), (1, "c")], [(2, "b")]]


@pytest.mark.asyncio
async def test_pending_request_starts_with_empty_slots() -> None:
    fut: asyncio.Future[list[object]] = asyncio.get_running_loop().create_future()
    r = PendingRequest(fut, 3, 1.0, 0.0)
    assert r.results == [None, None, None] and r.remaining == 3
    assert r.abandoned(2.0) and not r.abandoned(0.5)
