"""A request a front end relays, and the app's answer to it (app/asks.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.types import Receive, Scope, Send

from app.asks import Asked, Replied, answer, asked

pytestmark = pytest.mark.asyncio


def request(path: str = "/x", body: bytes = b"") -> Asked:
    return Asked("POST", path, path.encode(), b"a=1", [(b"host", b"h")], ("10.0.0.1", 9), body)


async def test_what_a_front_end_sends_is_its_scope_with_the_headers_and_body_given() -> None:
    scope = {"method": "GET", "path": "/v2/a b", "raw_path": b"/v2/a%20b",
             "query_string": b"q=1", "headers": [(b"x", b"1")], "client": ["1.2.3.4", 5]}
    assert asked(scope, [(b"y", b"2")], b"{}") == Asked(
        "GET", "/v2/a b", b"/v2/a%20b", b"q=1", [(b"y", b"2")], ("1.2.3.4", 5), b"{}")


async def test_the_app_gets_the_body_once_and_a_disconnect_only_once_it_has_answered() -> None:
    """As a server calls it: a second receive waits (a handler watching for its client to
    leave is not told it left) until the answer is whole, which comes back in one piece."""
    seen: list[Any] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(await receive())
        watch = asyncio.ensure_future(receive())
        await asyncio.sleep(0.01)
        seen.append(watch.done())
        await send({"type": "http.response.start", "status": 202,
                    "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"one ", "more_body": True})
        await send({"type": "http.response.body", "body": b"two"})
        seen.append(watch)

    replied = await answer(app, request(body=b"payload"))
    assert replied == Replied(202, [(b"content-type", b"text/plain")], b"one two")
    first, waited, watch = seen
    assert first == {"type": "http.request", "body": b"payload", "more_body": False}
    assert waited is False and (await watch) == {"type": "http.disconnect"}


async def test_an_app_that_fails_answers_500_or_what_it_had_sent() -> None:
    async def fails_at_once(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("broken")

    async def fails_after_its_answer(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": b"Internal Server Error"})
        raise RuntimeError("broken")  # as Starlette's error middleware does

    replied = await answer(fails_at_once, request())
    assert replied.status == 500 and replied.body == b"Internal Server Error"
    assert await answer(fails_after_its_answer, request()) == Replied(
        500, [], b"Internal Server Error")
