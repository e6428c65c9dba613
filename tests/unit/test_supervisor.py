"""app/supervisor.py's judgement of hung front ends (``judge``); a hung front end killed and
replaced in a live server: tests/integration/test_frontends.py."""

from __future__ import annotations

from app.bridge import Heartbeat
from app.supervisor import judge

LIMIT_S = 30.0


def watched(heard: float | None) -> tuple[dict[int, Heartbeat], list[float]]:
    """One front end last heard from at ``heard``, and the times it was asked to answer."""
    asked: list[float] = []
    return {0: Heartbeat(heard=heard, ask=lambda: asked.append(0.0))}, asked


def test_a_silent_front_end_is_asked_to_answer_then_judged_hung_once() -> None:
    beats, asked = watched(100.0)
    assert judge(beats, 105.0, False, LIMIT_S) == [] and asked == []
    assert judge(beats, 111.0, False, LIMIT_S) == [] and len(asked) == 1  # a third: asked
    assert judge(beats, 120.0, False, LIMIT_S) == [] and len(asked) == 2
    assert judge(beats, 131.0, False, LIMIT_S) == [(0, 31.0)]
    assert judge(beats, 140.0, False, LIMIT_S) == []  # once


def test_an_answer_starts_its_clock_again() -> None:
    beats, asked = watched(100.0)
    assert judge(beats, 125.0, False, LIMIT_S) == [] and len(asked) == 1
    beats[0].heard = 126.0  # its answer, read by the bridge
    assert judge(beats, 130.0, False, LIMIT_S) == [] and len(asked) == 1
    assert judge(beats, 155.0, False, LIMIT_S) == [] and len(asked) == 2  # 29 s after it


def test_one_never_heard_from_is_not_judged() -> None:
    beats, asked = watched(None)
    assert judge(beats, 1e9, False, LIMIT_S) == [] and asked == []


def test_after_a_late_pass_every_clock_starts_again() -> None:
    """The device process's loop was held up: the answers may be in its socket, unread."""
    beats, asked = watched(100.0)
    assert judge(beats, 200.0, True, LIMIT_S) == [] and asked == []
    assert beats[0].heard == 200.0
    assert judge(beats, 231.0, False, LIMIT_S) == [(0, 31.0)]
