"""The front end's proxy: what it asks the device process for (app/frontend/app.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from app.frontend.app import DeviceProxy, proxied_target


def test_the_device_process_is_asked_for_the_path_the_client_sent() -> None:
    scope = {"path": "/v2/models/a/b", "raw_path": b"/v2/models/a%2Fb", "query_string": b""}
    assert proxied_target(scope) == "/v2/models/a%2Fb"  # one segment, as one process routes it
    scope = {"path": "/v2/models/\u00a8\x19/ready", "raw_path": b"/v2/models/%C2%A8%19/ready",
             "query_string": b"version=%F0%9F%87%BA&x=1"}
    assert proxied_target(scope) == "/v2/models/%C2%A8%19/ready?version=%F0%9F%87%BA&x=1"


def test_what_no_url_may_hold_is_escaped() -> None:
    raw = {"path": "/v2/models/a\nb", "raw_path": b"/v2/models/a\nb\xff", "query_string": b"q=\x01"}
    assert proxied_target(raw) == "/v2/models/a%0Ab%FF?q=%01"
    decoded_only = {"path": "/v2/models/a\nb%/ready", "query_string": b""}
    assert proxied_target(decoded_only) == "/v2/models/a%0Ab%25/ready"
    for scope in (raw, decoded_only):  # httpx takes it as it is
        url = httpx.URL("http://device" + proxied_target(scope))
        assert url.raw_path.startswith(b"/v2/models/a%0Ab")


def test_dot_segments_reach_the_device_process_unresolved() -> None:
    scope = {"path": "/v2/../metrics", "raw_path": b"/v2/../metrics", "query_string": b""}
    assert proxied_target(scope) == "/v2/%2E%2E/metrics"  # one process routes it as it is: 404
    assert httpx.URL("http://device" + proxied_target(scope)).raw_path == b"/v2/%2E%2E/metrics"
    scope = {"path": "/v2/./x.y/.z", "raw_path": b"/v2/./x.y/.z", "query_string": b""}
    assert proxied_target(scope) == "/v2/%2E/x.y/.z"


class Device:
    """The device process's app as the proxy's client sees it: each request waits for
    ``gate``, then is answered with its number."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []
        self.gate = asyncio.Event()

    async def request(self, method: str, target: str, headers: Any, content: bytes = b"",
                      timeout: float | None = None) -> httpx.Response:
        self.asked.append((method, target))
        n = len(self.asked)
        await self.gate.wait()
        return httpx.Response(200, json={"status": "ready", "answer": n})


async def get(proxy: DeviceProxy, path: str, query: bytes = b"", method: str = "GET",
              body: bytes = b"") -> tuple[int, bytes]:
    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(),
             "query_string": query, "headers": []}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await proxy(scope, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


@pytest.mark.asyncio
async def test_probes_asked_while_the_same_one_is_on_its_way_share_its_answer() -> None:
    """A flood of health probes or scrapes costs the device process one request at a time
    per front end; a probe that came after an answer gets a new one; other paths, and a
    probe with a body, are each asked for."""
    device = Device()
    service = SimpleNamespace(settings=SimpleNamespace(max_body_bytes=1024))
    proxy = DeviceProxy(service, lambda: device)  # type: ignore[arg-type, return-value]
    calls = [asyncio.ensure_future(get(proxy, *args)) for args in (
        *[("/health_check",)] * 4, ("/health_check", b"model=m"), ("/health_check", b"model=m"),
        ("/metrics",), ("/metrics",), ("/v2/health/ready", b"", "HEAD"),
        ("/v2/models/m",), ("/v2/models/m",), ("/health_check", b"", "GET", b"{}"))]
    await asyncio.sleep(0.05)
    gone = asyncio.ensure_future(get(proxy, "/health_check"))  # its client leaves meanwhile
    await asyncio.sleep(0.05)
    gone.cancel()
    assert sorted(device.asked) == sorted([
        ("GET", "/health_check"), ("GET", "/health_check?model=m"), ("GET", "/metrics"),
        ("HEAD", "/v2/health/ready"), ("GET", "/v2/models/m"), ("GET", "/v2/models/m"),
        ("GET", "/health_check")])
    device.gate.set()
    answers = await asyncio.gather(*calls)
    assert {status for status, _ in answers} == {200}
    assert len({body for _, body in answers[:4]}) == 1  # one answer, shared
    assert answers[4][1] == answers[5][1] and answers[6][1] == answers[7][1]
    assert answers[9][1] != answers[10][1]
    assert await get(proxy, "/health_check") != answers[0]  # asked again: a new answer
    assert len(device.asked) == 8
