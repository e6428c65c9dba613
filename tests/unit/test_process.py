"""app/process.py: the process-wide tuning the entry points apply."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

import pytest

from app.process import GIL_SWITCH_INTERVAL_S, freeze_startup_objects, tune_for_serving


@pytest.fixture
def restored() -> Iterator[None]:
    interval = sys.getswitchinterval()
    yield
    sys.setswitchinterval(interval)
    gc.unfreeze()


@pytest.mark.usefixtures("restored")
def test_the_switch_interval_is_lowered_never_raised() -> None:
    sys.setswitchinterval(0.005)
    tune_for_serving()
    assert sys.getswitchinterval() == pytest.approx(GIL_SWITCH_INTERVAL_S)
    sys.setswitchinterval(0.00005)
    tune_for_serving()
    assert sys.getswitchinterval() == pytest.approx(0.00005, abs=2e-6)  # whole microseconds


@pytest.mark.usefixtures("restored")
def test_what_is_alive_at_start_up_leaves_the_collectors_reach() -> None:
    kept = [object() for _ in range(1000)]
    freeze_startup_objects()
    assert gc.get_freeze_count() >= len(kept)
