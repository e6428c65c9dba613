"""gRPC's calls that are not inference, sent to the server's HTTP app (app/grpc/control.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from app.grpc.control import Control


class App:
    """The HTTP app as Control's client sees it: each request waits for ``gate``, then is
    answered with its number."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, Any]] = []
        self.gate = asyncio.Event()

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        self.asked.append((path, kwargs.get("params")))
        n = len(self.asked)
        await self.gate.wait()
        return httpx.Response(200, json={"status": "ready", "answer": n})


@pytest.mark.asyncio
async def test_health_and_readiness_asked_while_the_same_is_on_its_way_share_its_answer(
) -> None:
    """gRPC health checks (grpc.health.v1, ServerReady, ModelReady) cost the app one request at
    a time; metadata is asked for each call."""
    app = App()
    control = Control(app)  # type: ignore[arg-type]
    calls = [asyncio.ensure_future(control.get(path, {}, params)) for path, params in (
        *[("/v2/health/ready", None)] * 3, ("/health_check", {"model": "m"}),
        ("/health_check", {"model": "m"}), ("/health_check", {"model": "n"}),
        ("/v2/models/m/ready", None), ("/v2/models/m/ready", None), ("/v2", None),
        ("/v2", None))]
    await asyncio.sleep(0.05)
    assert sorted(app.asked, key=str) == sorted([
        ("/v2/health/ready", None), ("/health_check", {"model": "m"}),
        ("/health_check", {"model": "n"}), ("/v2/models/m/ready", None), ("/v2", None),
        ("/v2", None)], key=str)
    app.gate.set()
    answers = [body["answer"] for _, body in await asyncio.gather(*calls)]
    assert len(set(answers[:3])) == 1 and answers[3] == answers[4] != answers[5]
    assert answers[6] == answers[7] and answers[8] != answers[9]
    _, again = await control.get("/v2/health/ready", {})
    assert again["answer"] == 7  # asked after the answer came: asked again
