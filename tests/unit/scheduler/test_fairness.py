"""Fairness: which model's batch runs next on a device, with made-up costs (no device)."""

from __future__ import annotations

from app.scheduler.fairness import Fairness


def test_the_least_served_model_goes_next_ties_to_the_earliest_deadline() -> None:
    fair: Fairness[str] = Fairness()
    assert fair.pick([("slow", 5.0), ("fast", 9.0)]) == "slow"  # equal time: earlier deadline
    fair.charge("slow", 0.100)
    assert fair.pick([("slow", 5.0), ("fast", 9.0)]) == "fast"  # slow used more


def test_a_saturated_slow_model_holds_a_quiet_one_back_one_batch_at_most() -> None:
    """The slow model always has work (100 ms batches); the fast one (1 ms) gets a request now
    and then. Each fast request runs right after the slow batch in progress."""
    fair: Fairness[str] = Fairness()
    order, fast_waiting = [], False
    for step in range(60):
        fast_waiting = fast_waiting or step % 5 == 2  # a request arrives during this batch
        candidates = [("slow", float(step))]  # its backlog: older deadlines than any newcomer
        if fast_waiting:
            candidates.append(("fast", 1000.0 + step))
        chosen = fair.pick(candidates)
        order.append(chosen)
        fair.charge(chosen, 0.100 if chosen == "slow" else 0.001)
        if chosen == "fast":
            fast_waiting = False
            assert order[-2] == "slow"  # it arrived during that slow batch and went next
    assert order.count("fast") == 12  # every request it got was served at the next pick


def test_two_saturated_models_share_the_device_time() -> None:
    fair: Fairness[str] = Fairness()
    cost = {"a": 0.010, "b": 0.030}
    for _ in range(400):
        fair.charge(chosen := fair.pick([("a", 1.0), ("b", 1.0)]), cost[chosen])
    assert abs(fair.used_s["a"] - fair.used_s["b"]) <= max(cost.values())


def test_an_idle_model_does_not_bank_time() -> None:
    """A model that ran alone for an hour, then a newcomer: they share from there on."""
    fair: Fairness[str] = Fairness()
    for _ in range(36):
        fair.charge(fair.pick([("old", 1.0)]), 100.0)
    assert fair.pick([("old", 1.0), ("new", 2.0)]) == "new"  # caught up; a newcomer wins a tie
    assert fair.used_s["new"] == fair.used_s["old"] == 3600.0
    fair.charge("new", 100.0)
    assert fair.pick([("old", 1.0), ("new", 2.0)]) == "old"  # and from there on they share


def test_forgetting_a_model() -> None:
    fair: Fairness[str] = Fairness()
    fair.charge(fair.pick([("gone", 1.0)]), 5.0)
    fair.forget("gone")
    assert "gone" not in fair.used_s and "gone" not in fair.waiting
