"""app/draining.py: the server's drain phase and its start-up line."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import pytest
import uvicorn

from app import draining
from app.draining import DrainingServer

pytestmark = pytest.mark.asyncio


@dataclass
class Service:
    starting: bool
    status: str
    load_failed: bool = False
    load_error: str | None = None
    in_flight: int = 0

    def begin_drain(self) -> None:
        self.status = "draining"


@pytest.mark.parametrize(("starting", "status", "said"), [
    (True, "loading", False),
    (False, "ready", True),
    (False, "busy", True),  # ready, and at once as full as it may be
    (False, "draining", True),  # a SIGTERM came between start-up's end and this tick
    (False, "unhealthy", False),
])
async def test_ready_is_said_once_start_up_is_done_whatever_the_status_then(
        starting: bool, status: str, said: bool, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    frozen: list[bool] = []
    monkeypatch.setattr(draining, "freeze_startup_objects", lambda: frozen.append(True))
    server = DrainingServer(uvicorn.Config(app=None), Service(starting, status), 30.0)
    with caplog.at_level(logging.INFO, logger="batchserve"):
        for counter in (1, 2):
            await server.on_tick(counter)
            await asyncio.sleep(0)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ready in")]
    assert len(lines) == (1 if said else 0)
    assert frozen == ([True] if said else [])
