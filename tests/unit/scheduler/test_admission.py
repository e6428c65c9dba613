"""Admission by priority (room per level) and by predicted finish: the pure arithmetic, and the
gate that applies it to a run of requests."""

from __future__ import annotations

import random

import pytest

from app.errors import Unavailable, WouldMissDeadline
from app.scheduler.admission import Gate, predicted_wait_s, retry_after_s, room


def test_the_default_level_gets_the_capacity_the_urgent_more_the_rest_less() -> None:
    # two levels, default the lowest (the defaults): nothing changes for ordinary traffic
    assert room(1024, 2, 2, 2) == 1024 and room(1024, 2, 2, 1) == 1536
    # four levels, default 2: level 1 above, 3 and 4 below
    assert [room(100, 4, 2, p) for p in (1, 2, 3, 4)] == [125, 100, 75, 50]
    assert room(4, 4, 1, 4) >= 1  # never no room at all
    assert room(4, 1, 1, 1) == 4  # one level: the capacity


def test_the_predicted_wait_counts_batches_sharing_and_devices() -> None:
    # 64 items ahead, batches of 32 at 20 ms: the one in progress, then two more
    assert predicted_wait_s(64, 32, 0.020, 1, 1) == pytest.approx(0.060)
    assert predicted_wait_s(1, 32, 0.020, 1, 1) == pytest.approx(0.040)
    assert predicted_wait_s(64, 32, 0.020, 2, 1) == pytest.approx(0.120)  # two models take turns
    assert predicted_wait_s(64, 32, 0.020, 1, 2) == pytest.approx(0.030)  # two devices


def test_retry_after_is_whole_seconds_at_least_one() -> None:
    assert retry_after_s(0.01) == 1 and retry_after_s(2.2) == 3


def gate(depth: int = 0, through: int = 0, full_batch_s: float | None = None) -> Gate:
    # capacity 8 at the default level 2 of two: level 2 may fill 8 places, level 1 twelve
    return Gate("m", 8, 2, room(8, 2, 2, 2), depth, through, 4, full_batch_s, 1, 1)


def test_a_gate_counts_what_it_admitted_ahead_of_the_next_request() -> None:
    """A run of requests at one level (a front end's message) is admitted as if each were
    queued before the next: 8 places hold 8 items whichever way they come."""
    g = gate(depth=3, through=3)
    g.admit(4, None, 0.0)
    g.admit(1, None, 0.0)
    with pytest.raises(Unavailable) as refused:
        g.admit(1, None, 0.0)
    assert refused.value.type == "busy" and (g.depth, g.through) == (8, 8)
    g.admit(0, None, 0.0)  # nothing to queue: always room


def test_a_gate_refuses_what_would_finish_past_its_deadline_once_the_cost_is_known() -> None:
    g = gate(full_batch_s=0.010)  # batches of 4 at 10 ms
    g.admit(4, 0.050, 0.0)  # 4 ahead: the batch in progress and one more, 20 ms
    with pytest.raises(WouldMissDeadline) as late:
        g.admit(1, 0.025, 0.0)  # 5 ahead: 30 ms, after 25
    assert late.value.retry_after_s == 1 and (g.depth, g.through) == (4, 4)
    g.admit(1, 0.040, 0.0)  # the refusal queued nothing: 30 ms fits 40
    unknown = gate()
    unknown.admit(8, 0.0, 1.0)  # no cost model yet: no deadline refusal, only room


def test_a_request_with_nothing_queued_ahead_is_never_refused_on_its_deadline() -> None:
    """It would be served next whatever the prediction says; and a cost model taught by one
    stalled batch (1.6 s for one item: 103 s predicted) must not refuse everything after it,
    which would also keep it from learning again."""
    g = gate(full_batch_s=51.2)
    g.admit(1, 30.0, 0.0)
    with pytest.raises(WouldMissDeadline):
        g.admit(1, 30.0, 0.0)  # one ahead now


def test_a_deadline_past_the_longest_wait_is_admitted_as_the_prediction_would() -> None:
    """A deadline at least ``longest_s`` away (the wait with the queue full) needs no
    prediction: every run of requests gets the same answers as from the prediction alone."""
    assert gate(full_batch_s=0.010).longest_s == pytest.approx(predicted_wait_s(8, 4, 0.010, 1, 1))
    seen = set()
    for left in (0.005, 0.020, 0.030, 0.039, 0.040, 0.041, 1.0):
        g = gate(depth=1, through=1, full_batch_s=0.010)
        for n in (1, 2, 3, 1, 1):
            fits = (g.depth + n <= g.limit
                    and predicted_wait_s(g.through + n, 4, 0.010, 1, 1) <= left)
            try:
                g.admit(n, left, 0.0)
            except (Unavailable, WouldMissDeadline):
                admitted = False
            else:
                admitted = True
            assert admitted == fits, (left, n)
            seen.add(admitted)
    assert seen == {True, False}


def test_admitting_one_item_requests_all_at_once_agrees_with_one_by_one() -> None:
    """``admit_all`` counts them only where ``admit`` one after another would admit every one
    (whatever their deadlines, room and cost); where it declines, it has counted nothing."""
    rng = random.Random(7)
    declined = 0
    for _ in range(3000):
        depth = rng.randint(0, 8)
        through = rng.randint(0, depth)
        cost = rng.choice([None, 0.001, 0.010, 0.050])
        n = rng.randint(1, 6)
        deadlines = [rng.choice([0.005, 0.02, 0.04, 0.08, 1.0]) for _ in range(n)]
        one_by_one = gate(depth=depth, through=through, full_batch_s=cost)
        passed = [one_by_one.refusal(1, d, 0.0) is None for d in deadlines]
        g = gate(depth=depth, through=through, full_batch_s=cost)
        if g.admit_all(n, min(deadlines), 0.0):
            assert all(passed) and (g.depth, g.through) == (depth + n, through + n)
        else:
            declined += 1
            assert (g.depth, g.through) == (depth, through)
            if cost is None or not through and n == 1:  # only room can refuse: no false decline
                assert not all(passed)
    assert 0 < declined < 3000
