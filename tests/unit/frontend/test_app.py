"""The front end's proxy: what it asks the device process's app, and what it answers
(app/frontend/app.py)."""

from __future__ import annotations

import asyncio
from functools import partial
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from starlette.types import Receive, Scope, Send

from app.api.body import LIKELY_WHOLE
from app.arriving import Arriving
from app.asks import Asked, Replied, answer
from app.errors import Unavailable
from app.frontend.app import DeviceProxy
from tests.conftest import wait_until


async def call(proxy: DeviceProxy, path: str, query: bytes = b"", method: str = "GET",
               body: bytes = b"", raw_path: bytes | None = None,
               headers: list[tuple[bytes, bytes]] | None = None
               ) -> tuple[int, dict[bytes, bytes], bytes]:
    """The proxy's answer to one request: status, headers, body."""
    scope = {"type": "http", "method": method, "path": path,
             "raw_path": path.encode() if raw_path is None else raw_path,
             "query_string": query, "headers": headers or [], "client": ("10.1.2.3", 5555)}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await proxy(scope, receive, send)
    return (sent[0]["status"], dict(sent[0]["headers"]),
            b"".join(m.get("body", b"") for m in sent[1:]))


def proxy_to(ask: Any) -> DeviceProxy:
    service = SimpleNamespace(settings=SimpleNamespace(max_body_bytes=1024),
                              link=SimpleNamespace(ask=ask), arriving=Arriving(4096))
    return DeviceProxy(service)  # type: ignore[arg-type]


async def echo(scope: Scope, receive: Receive, send: Send) -> None:
    """An app that answers with what it was asked, as JSON."""
    message = await receive()
    seen = {"method": scope["method"], "path": scope["path"],
            "raw_path": scope["raw_path"].decode("latin-1"),
            "query": scope["query_string"].decode("latin-1"),
            "headers": [[k.decode(), v.decode()] for k, v in scope["headers"]],
            "client": scope["client"], "body": message["body"].decode()}
    body = orjson.dumps(seen)
    await send({"type": "http.response.start", "status": 201, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"x-request-id", b"the-device-s"), (b"server", b"device"), (b"x-kept", b"yes")]})
    await send({"type": "http.response.body", "body": body})


@pytest.mark.asyncio
async def test_the_device_process_s_app_sees_the_request_the_client_sent() -> None:
    """The path as sent, raw and decoded (an escaped '/' stays one segment, dot segments and
    control characters are not resolved or refused on the way), the query, the body, the
    client's address and its headers but the hop-by-hop ones; its answer comes back whole,
    without the headers this front end's server sets itself."""
    proxy = proxy_to(partial(answer, echo))
    for path, raw, query in (("/v2/models/a/b", b"/v2/models/a%2Fb", b""),
                             ("/v2/../metrics", b"/v2/../metrics", b""),
                             ("/v2/models/a\nb/ready", b"/v2/models/a\nb\xff/ready", b"q=\x01"),
                             ("/v2/models/\u00a8/ready", b"/v2/models/%C2%A8/ready",
                              b"version=%F0%9F%87%BA&x=1")):
        status, headers, body = await call(
            proxy, path, query, "POST", b'{"x": 1}', raw,
            [(b"host", b"example:8000"), (b"connection", b"keep-alive"),
             (b"x-request-id", b"the-client-s"), (b"content-length", b"8")])
        seen = orjson.loads(body)
        assert status == 201 and seen["path"] == path and seen["query"] == query.decode()
        assert seen["raw_path"] == raw.decode("latin-1") and seen["body"] == '{"x": 1}'
        assert seen["method"] == "POST" and seen["client"] == ["10.1.2.3", 5555]
        assert seen["headers"] == [["host", "example:8000"], ["content-length", "8"]]
        assert headers[b"x-kept"] == b"yes" and headers[b"content-length"] == str(
            len(body)).encode()
        assert b"server" not in headers and b"x-request-id" not in headers


@pytest.mark.asyncio
async def test_a_head_answer_keeps_the_length_of_the_get() -> None:
    async def head(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"123")]})
        await send({"type": "http.response.body", "body": b""})

    status, headers, body = await call(proxy_to(partial(answer, head)), "/health_check",
                                       method="HEAD")
    assert (status, headers[b"content-length"], body) == (200, b"123", b"")


@pytest.mark.asyncio
async def test_a_device_process_gone_or_not_answering_in_time_is_503() -> None:
    async def gone(request: Asked) -> Replied:
        raise Unavailable("unhealthy", "the device process has stopped")

    status, headers, body = await call(proxy_to(gone), "/health_check")
    assert status == 503 and orjson.loads(body)["status"] == "unhealthy"
    status, _, body = await call(proxy_to(gone), "/openapi.json")
    assert status == 503 and orjson.loads(body)["error"]["type"] == "unhealthy"
    status, _, body = await call(proxy_to(gone), "/v2/models/m")  # the protocol's form
    assert status == 503 and "device process" in orjson.loads(body)["error"]

    async def held(request: Asked) -> Replied:
        await asyncio.sleep(3600)
        raise AssertionError

    proxy = proxy_to(held)
    reason = "the device process did not answer within 0.01 s"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("app.api.relay.proxy_timeout", lambda method, path: 0.01)
        status, _, body = await call(proxy, "/health_check")
        assert status == 503 and orjson.loads(body)["reason"] == reason
        status, _, body = await call(proxy, "/metrics")
        assert status == 503 and orjson.loads(body)["error"] == {
            "type": "unhealthy", "message": reason}
        status, _, body = await call(proxy, "/v2/models/m")
        assert status == 503 and orjson.loads(body)["error"] == reason


class Device:
    """The device process's app as the proxy sees it: each request waits for ``gate``, then
    is answered with its number."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []
        self.gate = asyncio.Event()

    async def ask(self, request: Asked) -> Replied:
        query = request.query_string.decode()
        self.asked.append((request.method, request.path + ("?" + query if query else "")))
        n = len(self.asked)
        await self.gate.wait()
        return Replied(200, [(b"content-type", b"application/json")],
                       orjson.dumps({"status": "ready", "answer": n}))


@pytest.mark.asyncio
async def test_probes_asked_while_the_same_one_is_on_its_way_share_its_answer() -> None:
    """A flood of health probes or scrapes costs the device process one request at a time
    per front end; a probe that came after an answer gets a new one; other paths, and a
    probe with a body, are each asked for."""
    device = Device()
    proxy = proxy_to(device.ask)
    calls = [asyncio.ensure_future(call(proxy, *args)) for args in (
        *[("/health_check",)] * 4, ("/health_check", b"model=m"), ("/health_check", b"model=m"),
        ("/metrics",), ("/metrics",), ("/v2/health/ready", b"", "HEAD"),
        ("/v2/models/m",), ("/v2/models/m",), ("/health_check", b"", "GET", b"{}"))]
    await wait_until(lambda: len(device.asked) == 7, "each distinct call asked for")
    gone = asyncio.ensure_future(call(proxy, "/health_check"))  # its client leaves meanwhile
    await asyncio.sleep(0.05)
    gone.cancel()
    assert sorted(device.asked) == sorted([
        ("GET", "/health_check"), ("GET", "/health_check?model=m"), ("GET", "/metrics"),
        ("HEAD", "/v2/health/ready"), ("GET", "/v2/models/m"), ("GET", "/v2/models/m"),
        ("GET", "/health_check")])
    device.gate.set()
    answers = await asyncio.gather(*calls)
    assert {status for status, _, _ in answers} == {200}
    assert len({body for _, _, body in answers[:4]}) == 1  # one answer, shared
    assert answers[4][2] == answers[5][2] and answers[6][2] == answers[7][2]
    assert answers[9][2] != answers[10][2]
    assert (await call(proxy, "/health_check"))[2] != answers[0][2]  # asked again: a new one
    assert len(device.asked) == 8


@pytest.mark.asyncio
async def test_a_long_body_keeps_its_room_till_the_device_process_answers() -> None:
    """A front end holds a proxied body till its answer comes: while the device process is
    slow to answer, a second long body finds no room (503 busy in the path's protocol's form);
    a short one takes none."""
    gate = asyncio.Event()

    async def slow(request: Asked) -> Replied:
        if len(request.body) > LIKELY_WHOLE:
            await gate.wait()
        return Replied(200, [], b"{}")

    async def synced() -> None:
        pass

    room = Arriving(LIKELY_WHOLE * 3 // 2)
    proxy = DeviceProxy(SimpleNamespace(  # type: ignore[arg-type]
        settings=SimpleNamespace(max_body_bytes=10**6),
        link=SimpleNamespace(ask=slow, sync=synced), arriving=room))
    body = b" " * (LIKELY_WHOLE + 1)
    first = asyncio.create_task(call(proxy, "/v2/repository/index", method="POST", body=body))
    await wait_until(lambda: room.held == len(body), "the first body's room taken")
    status, headers, answer = await call(proxy, "/v2/repository/index", method="POST",
                                         body=body)
    assert status == 503 and headers[b"retry-after"] == b"1"
    assert "(max_receiving_bytes)" in orjson.loads(answer)["error"]
    assert (await call(proxy, "/v2/repository/index", method="POST", body=b"{}"))[0] == 200
    gate.set()
    assert (await first)[0] == 200 and room.held == 0
