"""app/supervisor.py's judgement of hung front ends (``judge``); a hung front end killed and
replaced in a live server: tests/integration/test_frontends.py."""

from __future__ import annotations

import errno
import io
import logging
import socket
from types import SimpleNamespace
from typing import Any

import pytest

import app.supervisor as supervisor
from app.bridge import Heartbeat
from app.config import Settings
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


class Fake(SimpleNamespace):
    """A started front end."""

    pid = 1234

    def wait(self) -> int:
        return 0


class Dead:
    """A front end that has exited."""

    pid = 4321

    def wait(self) -> int:
        return -9


class Restarts:
    def __init__(self) -> None:
        self.count = 0

    def inc(self) -> None:
        self.count += 1


@pytest.mark.asyncio
async def test_a_front_end_that_cannot_be_started_again_is_tried_again(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """No fork for a while (a pids or memory limit): the replacement is tried again, not
    given up (its socket would hold the connections the kernel gives it, unanswered)."""
    started: list[list[str]] = []

    def popen(args: list[str], **kwargs: Any) -> Any:
        started.append(args)
        if len(started) < 3:
            raise OSError(errno.EAGAIN, "fork")
        return Fake(stdin=io.BytesIO())

    async def serve(inbox: Any, transport: Any, beat: Heartbeat) -> None:
        transport.close()  # as the bridge does when its link ends

    restarts = Restarts()
    bridge = SimpleNamespace(serve=serve,
                             service=SimpleNamespace(metrics=SimpleNamespace(
                                 frontend_restarts=restarts)))
    monkeypatch.setattr(supervisor.subprocess, "Popen", popen)
    monkeypatch.setattr(supervisor, "RESTART_DELAY_S", 0.0)
    listener = socket.socket()
    frontends = supervisor.Frontends(Settings(), [listener], bridge)  # type: ignore[arg-type]
    try:
        with caplog.at_level(logging.ERROR, "batchserve.frontends"):
            await frontends._watch(0, Dead())  # type: ignore[arg-type]
    finally:
        frontends.stopping = True  # the started one's own watch and link end here
        await frontends._tasks.wait()
        listener.close()
    assert len(started) == 3 and restarts.count == 1
    assert isinstance(frontends.processes[0], Fake)
    assert [r.getMessage() for r in caplog.records][1:] == [
        "front end 0 could not be started (Resource temporarily unavailable); trying again "
        "in 0s"] * 2
