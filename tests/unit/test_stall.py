"""app/stall.py: when a device thread's call counts as stuck, and when it goes on."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from app.errors import Unavailable
from app.stall import (
    LEAST_DEFAULT_S,
    Call,
    CallClock,
    check_not_stuck,
    ended_unless_stuck,
    judge,
    limit_s,
    unless_stuck,
)


@dataclass
class Thread:
    label: str = "cuda:0"
    clock: CallClock = field(default_factory=CallClock)


def model(request_timeout_s: float = 30.0) -> Any:
    return SimpleNamespace(name="mlp",
                           settings=SimpleNamespace(request_timeout_s=request_timeout_s))


def test_the_limit_is_the_setting_else_the_models_request_timeout_at_least_10_s() -> None:
    assert limit_s(Call(0.0, model(30), 8), 5.0) == 5.0
    assert limit_s(Call(0.0, model(30), 8), None) == 30  # its requests all timed out by then
    assert limit_s(Call(0.0, model(600), 8), None) == 600
    assert limit_s(Call(0.0, model(2), 8), None) == LEAST_DEFAULT_S == 10


def test_a_call_past_its_limit_is_marked_once_and_cleared_when_it_returns(
        caplog: pytest.LogCaptureFixture) -> None:
    thread, other = Thread(), Thread("cuda:1")
    with thread.clock.timing(model(), 256), other.clock.timing(model(), 4):
        call = thread.clock.call
        assert call is not None
        other.clock.call = Call(call.since + 9.0, model(), 4)  # started later: not yet
        with caplog.at_level(logging.WARNING, "batchserve.service"):
            assert judge([thread, other], call.since + 9.9, 10.0) == []
            assert judge([thread, other], call.since + 10.0, 10.0) == [thread]
            assert thread.clock.stuck is call and other.clock.stuck is None
            assert judge([thread, other], call.since + 18.0, 10.0) == []  # judged once
        (line,) = caplog.records
        assert line.levelno == logging.CRITICAL
        assert line.getMessage().startswith(
            "device thread cuda:0 is stuck: model mlp's call on a batch of 256 rows has run 10 s")
    assert thread.clock.call is None  # returned
    caplog.clear()
    with caplog.at_level(logging.WARNING, "batchserve.service"):
        assert judge([thread, other], call.since + 31.0, 10.0) == [thread]
    assert thread.clock.stuck is None
    assert caplog.messages == ["device thread cuda:0 goes on: model mlp's stuck call has returned"]


def test_a_new_call_after_a_stuck_one_clears_the_mark_and_is_judged_afresh() -> None:
    thread = Thread()
    stuck = Call(0.0, model(), 8)
    thread.clock.call = stuck
    assert judge([thread], 10.0, 5.0) == [thread]
    thread.clock.call = Call(10.5, model(), 8)  # the stuck one returned, the next began
    assert judge([thread], 11.0, 5.0) == [thread] and thread.clock.stuck is None
    assert judge([thread], 15.5, 5.0) == [thread] and thread.clock.stuck is thread.clock.call


def test_a_call_that_raises_is_no_longer_timed() -> None:
    clock = CallClock()
    with pytest.raises(RuntimeError), clock.timing(model(), 1):
        raise RuntimeError("model failed")
    assert clock.call is None


@pytest.mark.asyncio
async def test_a_command_is_waited_for_unless_its_thread_is_stuck() -> None:
    thread = Thread()
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.call_later(0.01, done.set_result, None)
    assert await unless_stuck(done, thread)  # once the command ran
    check_not_stuck(thread)
    never = loop.create_future()
    with thread.clock.timing(model(), 8):
        thread.clock.stuck = thread.clock.call
        assert not await unless_stuck(never, thread)
        with pytest.raises(Unavailable, match="device thread cuda:0 is stuck in a call "
                           r"\(model mlp's, for 0 s\)") as refused:
            check_not_stuck(thread)
    assert refused.value.type == "unhealthy" and not never.done()


@dataclass
class Joined(Thread):
    """A thread that ends after ``ends_after`` joins, or is judged stuck at ``stuck_after``."""

    ends_after: int | None = None
    stuck_after: int | None = None
    joins: int = 0

    def join(self, timeout: float | None = None) -> bool:
        self.joins += 1
        if self.joins == self.stuck_after:
            self.clock.stuck = Call(0.0, model(), 8)
        return self.joins == self.ends_after


@pytest.mark.asyncio
async def test_a_stopping_server_waits_for_a_thread_unless_it_is_or_becomes_stuck() -> None:
    ending = Joined(ends_after=3)
    assert await ended_unless_stuck(ending, 60.0) and ending.joins == 3
    becoming = Joined(stuck_after=2)  # its call judged stuck while the server waits
    assert not await ended_unless_stuck(becoming, 60.0) and becoming.joins == 2
    stuck = Joined(stuck_after=0)
    stuck.clock.stuck = Call(0.0, model(), 8)
    assert not await ended_unless_stuck(stuck, 60.0) and stuck.joins == 0
    assert not await ended_unless_stuck(Joined(), 0.05)  # neither: the timeout
