"""Cycle: the bytes, framing state and errors of uvicorn's RequestResponseCycle, each answer
in one write."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from app.cycle import Cycle
from tests.unit.test_connection import Transport

pytestmark = pytest.mark.asyncio

DEFAULTS = [(b"date", b"Sat, 05 Dec 2026 04:00:00 GMT"), (b"server", b"uvicorn")]
BODY = b'{"predictions": [[1.0]]}'
LENGTH = (b"content-length", str(len(BODY)).encode())


class Flow:
    write_paused = False


class Log:
    """The errors a cycle logs: each message, and its exception's type and text."""

    def __init__(self) -> None:
        self.errors: list[tuple[Any, ...]] = []

    def error(self, message: str, *args: Any, exc_info: BaseException | None = None) -> None:
        self.errors.append((message % args, type(exc_info), str(exc_info)))


async def outcome(cycle_class: type[RequestResponseCycle], messages: list[dict[str, Any]],
                  defaults: list[tuple[bytes, bytes]], method: str = "POST",
                  keep_alive: bool = True) -> tuple[Transport, tuple[Any, ...]]:
    """The transport of a cycle of ``cycle_class`` whose app sent ``messages``, and what the
    cycle wrote in all, whether it closed the connection, what it logged and its framing
    state."""
    transport, log = Transport(), Log()
    cycle = cycle_class(
        scope={"method": method, "http_version": "1.1"},  # type: ignore[typeddict-item]
        transport=transport, flow=Flow(), logger=log,  # type: ignore[arg-type]
        access_logger=logging.getLogger("test"), access_log=False, default_headers=defaults,
        message_event=asyncio.Event(), expect_100_continue=False, keep_alive=keep_alive,
        on_response=lambda: None)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        for message in messages:
            await send(message)

    await cycle.run_asgi(app)
    return transport, (b"".join(transport.writes), transport.is_closing(), log.errors,
                       cycle.keep_alive, cycle.chunked_encoding, cycle.expected_content_length,
                       cycle.response_complete)


def answer(headers: list[tuple[bytes, bytes]], body: bytes = BODY, status: int = 200
           ) -> list[dict[str, Any]]:
    return [{"type": "http.response.start", "status": status, "headers": headers},
            {"type": "http.response.body", "body": body}]


CASES = {
    "an inference answer": (answer([LENGTH, (b"content-type", b"application/json"),
                                    (b"x-request-id", b"abc")]), DEFAULTS),
    "names in capitals": (answer([(b"Content-Length", LENGTH[1]), (b"X-Thing", b"a\tb")]),
                          DEFAULTS),
    "connection close": (answer([LENGTH, (b"Connection", b"keep-alive, Close")]), DEFAULTS),
    "chunked": (answer([(b"transfer-encoding", b"Chunked")]), DEFAULTS),
    "chunked, then a length": (answer([(b"transfer-encoding", b"chunked"), LENGTH]), DEFAULTS),
    "no length": (answer([(b"content-type", b"text/plain")]), DEFAULTS),
    "no length, no content": (answer([], b"", 204), DEFAULTS),
    "streamed": ([{"type": "http.response.start", "status": 200, "headers": []},
                  {"type": "http.response.body", "body": b"a", "more_body": True},
                  {"type": "http.response.body", "body": b""}], DEFAULTS),
    "no defaults": (answer([LENGTH]), []),
    "a default that frames": (answer([LENGTH]), [*DEFAULTS, (b"connection", b"close")]),
    "a name and a value as bytearrays": (answer([LENGTH, (bytearray(b"X-Id"),
                                                          bytearray(b"a"))]), DEFAULTS),
    "a name as a string": (answer([LENGTH, ("x-id", b"a")]), DEFAULTS),
    "a bad name": (answer([LENGTH, (b"bad name", b"x")]), DEFAULTS),
    "a bad value": (answer([LENGTH, (b"x-id", b"a\r\nset-cookie: x")]), DEFAULTS),
    "a bad default name": (answer([LENGTH]), [(b"x(y)", b"1")]),
    "a bad default value": (answer([LENGTH]), [(b"x-y", b"1\n")]),
    "a length that is no number": (answer([(b"content-length", b"ten")]), DEFAULTS),
    "a body longer than its length": (answer([LENGTH], BODY + b"!"), DEFAULTS),
    "a body shorter than its length": (answer([LENGTH], BODY[1:]), DEFAULTS),
    "a body first": (answer([LENGTH])[1:], DEFAULTS),
    "a start twice": (answer([LENGTH])[:1] * 2, DEFAULTS),
    "a message after the answer": (answer([LENGTH]) * 2, DEFAULTS),
}


@pytest.mark.parametrize("messages, defaults", CASES.values(), ids=CASES.keys())
async def test_a_cycle_writes_and_refuses_what_uvicorns_does_in_fewer_writes(
        messages: list[dict[str, Any]], defaults: list[tuple[bytes, bytes]]) -> None:
    theirs, their_outcome = await outcome(RequestResponseCycle, messages, defaults)
    ours, our_outcome = await outcome(Cycle, messages, defaults)
    assert our_outcome == their_outcome
    assert their_outcome[0] or their_outcome[2]  # each case writes something or fails
    n = len(theirs.writes)  # the head is joined to what uvicorn wrote after it, if anything
    assert len(ours.writes) == max(n - 1, min(n, 1))


async def test_an_answer_goes_out_in_one_write() -> None:
    ours, (written, *_) = await outcome(Cycle, CASES["an inference answer"][0], DEFAULTS)
    assert ours.writes == [written] and written.endswith(b"\r\n\r\n" + BODY)


@pytest.mark.parametrize("method, keep_alive", [("HEAD", True), ("POST", False)])
async def test_a_head_request_and_a_closing_connection_as_uvicorn(method: str, keep_alive: bool
                                                                   ) -> None:
    messages = answer([LENGTH])
    _, theirs = await outcome(RequestResponseCycle, messages, DEFAULTS, method, keep_alive)
    ours, our_outcome = await outcome(Cycle, messages, DEFAULTS, method, keep_alive)
    assert our_outcome == theirs and len(ours.writes) == 1


async def test_each_new_list_of_default_headers_is_the_one_written() -> None:
    """uvicorn makes a new list each second, with its date: the head has the list it has."""
    for date in (b"Sat, 05 Dec 2026 04:00:00 GMT", b"Sat, 05 Dec 2026 04:00:01 GMT"):
        defaults = [(b"date", date), (b"server", b"uvicorn")]
        _, (written, *_) = await outcome(Cycle, answer([LENGTH]), defaults)
        assert written == (await outcome(RequestResponseCycle, answer([LENGTH]), defaults))[1][0]
        assert b"date: " + date + b"\r\n" in written
