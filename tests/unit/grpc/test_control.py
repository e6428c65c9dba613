"""gRPC's calls that are not inference, sent to the server's HTTP app (app/grpc/control.py)."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import orjson
import pytest
from fastapi import FastAPI, Request

from app.asks import Asked, Replied, answer
from app.errors import Relayed, Unavailable
from app.grpc.control import Control, _relayed
from tests.conftest import wait_until


class App:
    """The HTTP app as Control sees it: each request waits for ``gate``, then is answered
    with its number."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, Any]] = []
        self.gate = asyncio.Event()

    async def ask(self, request: Asked) -> Replied:
        query = request.query_string.decode()
        self.asked.append((request.path, dict([query.split("=")]) if query else None))
        n = len(self.asked)
        await self.gate.wait()
        return Replied(200, [], orjson.dumps({"status": "ready", "answer": n}))


@pytest.mark.asyncio
async def test_health_and_readiness_asked_while_the_same_is_on_its_way_share_its_answer(
) -> None:
    """gRPC health checks (grpc.health.v1, ServerReady, ModelReady) cost the app one request at
    a time; metadata is asked for each call."""
    app = App()
    control = Control(app.ask)
    calls = [asyncio.ensure_future(control.get(path, {}, params)) for path, params in (
        *[("/v2/health/ready", None)] * 3, ("/health_check", {"model": "m"}),
        ("/health_check", {"model": "m"}), ("/health_check", {"model": "n"}),
        ("/v2/models/m/ready", None), ("/v2/models/m/ready", None), ("/v2", None),
        ("/v2", None))]
    await wait_until(lambda: len(app.asked) == 6, "each distinct call asked for")
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


@pytest.mark.asyncio
async def test_a_call_is_the_http_request_it_stands_for_and_an_error_its_status() -> None:
    """The app sees the path (a model's name escaped), the query, the body, the request's
    credentials; an error answer is the same status, type and message."""
    app = FastAPI()
    seen: list[dict[str, Any]] = []

    @app.api_route("/v2/models/{name}/{action}", methods=["GET", "POST"])
    async def model(name: str, action: str, request: Request) -> Any:
        seen.append({"name": name, "query": dict(request.query_params),
                     "body": await request.body(),
                     "auth": request.headers.get("authorization")})
        if action == "load":
            return {}
        return orjson.loads(b'{"status": "ready"}')

    control = Control(partial(answer, app))
    status, body = await control.get("/v2/models/a%20%C3%A9/ready", {"authorization": "Bearer k"},
                                     {"version": "2"})
    assert (status, body) == (200, {"status": "ready"})
    assert seen[-1] == {"name": "a \u00e9", "query": {"version": "2"}, "body": b"",
                        "auth": "Bearer k"}
    assert await control.post("/v2/models/m/load", {}, {"parameters": {}}) == {}
    assert seen[-1]["body"] == b'{"parameters":{}}'
    with pytest.raises(Relayed) as refused:
        await control.get("/v2/nothing", {})
    assert (refused.value.status, refused.value.type) == (404, "error")


@pytest.mark.parametrize(("retry", "seconds"), [
    (b"1", 1), (b"30", 30), (b"soon", None), (b"9" * 5000, None), (None, None)])
def test_an_errors_retry_after_travels_as_whole_seconds_or_not_at_all(
        retry: bytes | None, seconds: int | None) -> None:
    headers = [(b"retry-after", retry)] if retry is not None else []
    answer = Replied(503, headers, orjson.dumps({"error": {"type": "busy", "message": "full"}}))
    relayed = _relayed(answer)
    assert (relayed.status, relayed.type, relayed.retry_after_s) == (503, "busy", seconds)


@pytest.mark.asyncio
async def test_an_app_gone_or_not_answering_in_time_is_unavailable_and_a_probe_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Health and readiness read 503 unhealthy with the reason (ServerLive false, as HTTP's
    503); anything else raises Unavailable, which a call answers UNAVAILABLE."""
    async def held(request: Asked) -> Replied:
        await asyncio.sleep(3600)
        raise AssertionError

    async def gone(request: Asked) -> Replied:
        raise Unavailable("unhealthy", "the device process has stopped")

    monkeypatch.setattr("app.api.relay.proxy_timeout", lambda method, path: 0.01)
    for ask, reason in ((held, "the device process did not answer within 0.01 s"),
                        (gone, "the device process has stopped")):
        control = Control(ask)
        for path in ("/v2/health/live", "/health_check", "/v2/models/m/versions/1/ready"):
            assert await control.get(path, {}) == (503, {"status": "unhealthy",
                                                         "reason": reason})
        for call in (control.get("/v2/models/m", {}), control.get("/metrics", {}),
                     control.post("/v2/repository/index", {})):
            with pytest.raises(Unavailable) as refused:
                await call
            assert (refused.value.type, str(refused.value)) == ("unhealthy", reason)


@pytest.mark.asyncio
async def test_a_503_is_a_probes_answer_and_any_other_calls_error() -> None:
    """Health and readiness answer 503 with a body of their own, which the call reads; the
    metadata of a model still loading is 503 too, an error that the call relays (its body
    was read as metadata: INTERNAL)."""
    async def app(request: Asked) -> Replied:
        if request.path.endswith("/ready"):
            return Replied(503, [], orjson.dumps({"name": "m", "ready": False}))
        return Replied(503, [(b"retry-after", b"1")],
                       orjson.dumps({"error": "model 'm' is loading"}))

    control = Control(app)
    assert await control.get("/v2/models/m/ready", {}) == (503, {"name": "m", "ready": False})
    for path in ("/v2/models/m", "/v2/models/m/config", "/v2/models/m/stats"):
        with pytest.raises(Relayed) as refused:
            await control.get(path, {})
        assert (refused.value.status, str(refused.value), refused.value.retry_after_s) == (
            503, "model 'm' is loading", 1)
