"""CostModel: interpolation between measured points, and refinement from served batches."""

from __future__ import annotations

import numpy as np
import pytest

from app.scheduler.cost import CostModel, grid


def test_between_points_it_interpolates_beyond_it_extrapolates() -> None:
    cost = CostModel([1, 8, 32], [0.002, 0.008, 0.020])
    assert cost.predict(1) == pytest.approx(0.002)
    assert cost.predict(4) == pytest.approx(0.002 + 0.006 * 3 / 7)
    assert cost.predict(64) == pytest.approx(0.020 + 0.012 * 32 / 24)
    assert cost.predict(0.5) == pytest.approx(0.002)  # below the first: no cheaper than it
    assert CostModel().predict(8) == 0.0 and not CostModel().known
    assert CostModel([4], [0.004]).predict(8) == pytest.approx(0.008)


def test_measurements_keep_the_median() -> None:
    cost = CostModel.measured([(1, 0.001), (1, 0.005), (1, 0.002), (4, 0.003)])
    assert cost.curve() == [(1, 0.002), (4, 0.003)]
    assert grid(32) == [1, 2, 4, 8, 16, 32] and grid(5) == [1, 2, 4, 5] and grid(1) == [1]


def test_served_batches_pull_the_curve_to_what_the_device_does() -> None:
    cost = CostModel([1, 8, 32], [0.002, 0.008, 0.020])
    for _ in range(100):
        cost.observe(8, 0.016)  # the device got twice as slow at 8 (a neighbour, a throttle)
    assert cost.predict(8) == pytest.approx(0.016, rel=0.01)
    assert cost.predict(1) == pytest.approx(0.002)  # far points keep what they were
    empty = CostModel()
    empty.observe(4, 0.003)
    assert empty.curve() == [(4, 0.003)]


def test_a_device_thread_prices_every_size_at_once_as_one_at_a_time() -> None:
    work = np.array([0.5, 1, 4, 8, 20, 32, 64, 300], dtype=np.float64)
    for cost in (CostModel([1, 8, 32], [0.002, 0.008, 0.020]), CostModel([4], [0.004]),
                 CostModel(), CostModel([1, 8], [0.008, 0.002])):  # the last falls to 0
        assert cost.predict_all(work).tolist() == pytest.approx(
            [cost.predict(w) for w in work.tolist()])
    assert CostModel([1, 8], [0.008, 0.002]).predict(64) == 0.0  # never below nothing


def test_one_batch_far_off_moves_the_curve_a_tenth_at_most() -> None:
    cost = CostModel([1, 8, 32], [0.002, 0.008, 0.020])
    cost.observe(1, 0.6)  # a thread's cold first call: 300 x the point
    assert cost.predict(1) == pytest.approx(0.0022)
    cost.observe(32, 0.0)  # faster than any batch could be: a tenth off, as ever
    assert cost.predict(32) == pytest.approx(0.018)
    for _ in range(40):
        cost.observe(8, 0.08)  # the device really got ten times as slow
    assert cost.predict(8) == pytest.approx(0.08, rel=0.05)
