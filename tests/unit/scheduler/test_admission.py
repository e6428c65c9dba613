"""Admission by priority (room per level) and by predicted finish: the pure arithmetic."""

from __future__ import annotations

import pytest

from app.scheduler.admission import predicted_wait_s, retry_after_s, room


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
