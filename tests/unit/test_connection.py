"""OneWriteProtocol: the same bytes as uvicorn's httptools protocol, in fewer writes."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from app.api.inference import CUT_OFF
from app.connection import MAX_HEAD_BYTES, OneWriteProtocol, protocol_for
from app.flow import PIPELINE_LIMIT
from tests.conftest import wait_until

pytestmark = pytest.mark.asyncio

BODY = b'{"predictions": [[1.0, 2.0]]}'


class Transport:
    """What the protocol writes (one entry per write call), and when it closed the connection."""

    def __init__(self) -> None:
        self.events: list[Any] = []  # bytes per write, then "close"

    @property
    def writes(self) -> list[bytes]:
        return [e for e in self.events if isinstance(e, bytes)]

    def write(self, data: bytes) -> None:
        self.events.append(bytes(data))

    def writelines(self, parts: list[bytes]) -> None:  # one write of all of them
        self.events.append(b"".join(parts))

    def close(self) -> None:
        self.events.append("close")

    def is_closing(self) -> bool:
        return "close" in self.events

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 5000)}.get(
            name, default)

    def set_protocol(self, protocol: Any) -> None:  # a WebSocket's, taking the connection
        self.events.append(protocol)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def answer(scope: Any, receive: Any, send: Any) -> None:
    """A one-message response, as every batchserve answer is."""
    await receive()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(BODY)).encode())]})
    await send({"type": "http.response.body", "body": BODY})


async def stream(scope: Any, receive: Any, send: Any) -> None:
    """A streamed response: three chunks, no length."""
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    for part in (b"a", b"b"):
        await send({"type": "http.response.body", "body": part, "more_body": True})
    await send({"type": "http.response.body", "body": b"c"})


POST = b"POST /predict HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}"


def connect(protocol_class: type[HttpToolsProtocol], app: Any, request: bytes = POST
            ) -> tuple[HttpToolsProtocol, Transport]:
    """A connection of ``protocol_class`` serving ``app`` that has received ``request``."""
    config = Config(app, http=protocol_class, lifespan="off", log_config=None)
    config.load()
    protocol = protocol_class(config=config, server_state=ServerState(), app_state={})
    transport = Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    protocol.data_received(request)
    return protocol, transport


async def exchange(protocol_class: type[HttpToolsProtocol], app: Any, request: bytes
                   ) -> Transport:
    """``request`` through a protocol of ``protocol_class`` serving ``app``; the transport once
    the response is complete."""
    protocol, transport = connect(protocol_class, app, request)
    await wait_until(lambda: protocol.cycle.response_complete, "the response")
    return transport


async def test_a_whole_response_goes_out_in_one_write_with_uvicorns_bytes() -> None:
    theirs = await exchange(HttpToolsProtocol, answer, POST)
    ours = await exchange(OneWriteProtocol, answer, POST)
    assert len(theirs.writes) == 2  # head, then body
    assert ours.writes == [b"".join(theirs.writes)]
    assert ours.writes[0].startswith(b"HTTP/1.1 200 OK") and ours.writes[0].endswith(BODY)


async def test_a_closing_connection_is_written_then_closed_as_uvicorn_does() -> None:
    request = POST.replace(b"host: x\r\n", b"host: x\r\nconnection: close\r\n")
    theirs = await exchange(HttpToolsProtocol, answer, request)
    ours = await exchange(OneWriteProtocol, answer, request)
    assert theirs.events[-1] == "close" and ours.events[-1] == "close"
    assert ours.events[:-1] == [b"".join(theirs.writes)]


async def test_a_head_request_gets_its_head_alone() -> None:
    request = b"HEAD /predict HTTP/1.1\r\nhost: x\r\n\r\n"
    theirs = await exchange(HttpToolsProtocol, answer, request)
    ours = await exchange(OneWriteProtocol, answer, request)
    assert ours.writes == [b"".join(theirs.writes)]
    assert not ours.writes[0].endswith(BODY)


async def test_a_streamed_response_joins_its_head_to_the_first_chunk_only() -> None:
    theirs = await exchange(HttpToolsProtocol, stream, POST)
    ours = await exchange(OneWriteProtocol, stream, POST)
    assert b"".join(ours.writes) == b"".join(theirs.writes)
    assert len(theirs.writes) == 4 and len(ours.writes) == 3
    assert ours.writes[0] == theirs.writes[0] + theirs.writes[1]


async def test_an_app_that_fails_after_its_head_still_sends_it() -> None:
    """uvicorn raises on a body longer than the declared length; the head it had written before
    goes out as it did without joining, and the connection is closed."""
    async def too_long(scope: Any, receive: Any, send: Any) -> None:
        await answer(scope, receive, lambda m: send({**m, "body": m["body"] + b"!"})
                     if m["type"] == "http.response.body" else send(m))

    _, transport = connect(OneWriteProtocol, too_long)
    await wait_until(lambda: "close" in transport.events, "the connection closed")
    await asyncio.sleep(0)
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK")
    assert BODY not in b"".join(transport.writes)


async def test_a_client_gone_between_head_and_body_gets_nothing_written() -> None:
    """uvicorn drops what an app sends to a disconnected client; the held head goes with it."""
    go_on = asyncio.Event()

    async def slow_body(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await go_on.wait()
        await send({"type": "http.response.body", "body": b"late"})

    protocol, transport = connect(OneWriteProtocol, slow_body)
    await wait_until(lambda: protocol.cycle.response_started, "the head sent")
    protocol.connection_lost(None)
    go_on.set()
    await wait_until(lambda: not protocol.server_state.tasks, "the app finished")
    assert transport.writes == []


async def refuse(scope: Any, receive: Any, send: Any) -> None:
    """An answer given without reading the body (a 404 for an unknown model, a 413)."""
    await send({"type": "http.response.start", "status": 404,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})


EXPECTING = (b"POST /predict HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\n"
             b"content-length: 2\r\n\r\n")


async def test_an_answer_before_the_body_a_client_waits_to_send_closes_the_connection() -> None:
    """A client that sent ``Expect: 100-continue`` and got a final answer instead sends no
    body: read on, the connection would take its next request for that body and answer it
    nothing till the read timeout. The answer says ``Connection: close`` (RFC 9110, 10.1.1)
    and the connection closes after it; the answer is uvicorn's otherwise."""
    theirs = await exchange(HttpToolsProtocol, refuse, EXPECTING)
    ours = await exchange(OneWriteProtocol, refuse, EXPECTING)
    assert "close" not in theirs.events  # uvicorn would wait for the body
    (written,) = ours.writes
    assert written == b"".join(theirs.writes).replace(
        b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n", 1)
    assert ours.events[-1] == "close"


async def test_a_body_sent_after_100_continue_or_without_waiting_keeps_the_connection() -> None:
    """The same request whose body the app reads (after ``100 Continue``), or whose client sent
    it without waiting: the connection stays open for the next request."""
    protocol, transport = connect(OneWriteProtocol, answer, EXPECTING)
    await wait_until(lambda: transport.writes, "the 100 Continue")
    assert transport.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    protocol.data_received(b"{}")
    await wait_until(lambda: protocol.cycle.response_complete, "the answer")
    sent_anyway = await exchange(OneWriteProtocol, refuse, EXPECTING + b"{}")
    for events in (transport.events, sent_anyway.events):
        assert "close" not in events and b"connection: close" not in events[-1]
        assert events[-1].startswith(b"HTTP/1.1 ")


async def test_an_http_1_0_client_is_sent_no_100_continue() -> None:
    """It knows no 1xx answer and would take one for its answer: its ``Expect`` is ignored
    (RFC 9110, 10.1.1), and the body is read when it comes."""
    asking = asyncio.Event()

    async def reads(scope: Any, receive: Any, send: Any) -> None:
        asking.set()  # receive, next in this step, writes any 100 Continue before it waits
        await answer(scope, receive, send)

    request = EXPECTING.replace(b"HTTP/1.1", b"HTTP/1.0")
    protocol, transport = connect(OneWriteProtocol, reads, request)
    await asking.wait()
    assert transport.events == []
    protocol.data_received(b"{}")
    await wait_until(lambda: "close" in transport.events, "the answer")
    (written,) = transport.writes
    assert written.startswith(b"HTTP/1.1 200 OK") and written.endswith(BODY)


async def test_a_request_sent_as_the_server_shuts_down_is_answered_then_closed() -> None:
    """uvicorn's shutdown closes a connection between requests at once: a request its client
    had just sent (in the socket, read in the loop's next pass) was reset, unanswered."""
    protocol, transport = connect(OneWriteProtocol, answer)
    await wait_until(lambda: protocol.cycle.response_complete, "the first answer")
    protocol.shutdown()
    assert "close" not in transport.events
    protocol.data_received(POST)
    await wait_until(lambda: "close" in transport.events, "the connection closed")
    first, last = transport.writes
    assert first.startswith(b"HTTP/1.1 200 OK") and b"connection: close" not in first
    assert last.startswith(b"HTTP/1.1 200 OK") and b"connection: close\r\n" in last
    assert last.endswith(BODY) and transport.events[-1] == "close"


async def test_at_shutdown_an_idle_connection_closes_and_one_under_way_after_its_answer(
        ) -> None:
    idle, idle_transport = connect(OneWriteProtocol, answer)
    await wait_until(lambda: idle.cycle.response_complete, "the answer")
    go_on = asyncio.Event()

    async def held(scope: Any, receive: Any, send: Any) -> None:
        await go_on.wait()
        await answer(scope, receive, send)

    busy, busy_transport = connect(OneWriteProtocol, held)
    idle.shutdown()
    busy.shutdown()
    await wait_until(lambda: "close" in idle_transport.events, "the idle connection closed")
    assert busy_transport.events == []
    go_on.set()
    await wait_until(lambda: "close" in busy_transport.events, "the busy one closed")
    (written,) = busy_transport.writes
    assert b"connection: close\r\n" in written and written.endswith(BODY)


@pytest.mark.parametrize("request_bytes", [
    b"POST /predict HTTP/1.1\r\nhost: x\r\ncontent-le",  # stalled in its headers
    b"POST /predict HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{\"inst",  # in its body
])
async def test_a_request_that_does_not_arrive_in_time_gets_408_and_is_closed(
        request_bytes: bytes) -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while (message := await receive())["type"] == "http.request" and message["more_body"]:
            pass
        seen.append(message["type"])  # the app, reading the body, sees the client gone

    protocol, transport = connect(protocol_for(0.05), app, request_bytes)
    await wait_until(lambda: "close" in transport.events, "the connection closed")
    (written,) = transport.writes
    assert written.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert written.endswith(b'{"error":{"type":"request_timeout","message":"the request did not '
                            b'arrive within 0.05 s"}}')
    protocol.connection_lost(None)  # as a real transport does once closed
    if b"\r\n\r\n" in request_bytes:
        await wait_until(lambda: seen, "the app done")
        assert seen == ["http.disconnect"]
        assert protocol.scope[CUT_OFF] == (408, "request_timeout")


class TimerCount:
    """A loop that counts the timers set on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.set = 0

    def call_later(self, *args: Any) -> asyncio.TimerHandle:
        self.set += 1
        return self.loop.call_later(*args)

    def call_at(self, *args: Any) -> asyncio.TimerHandle:
        self.set += 1
        return self.loop.call_at(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loop, name)


async def test_a_request_read_whole_at_once_is_never_timed() -> None:
    """Most requests arrive in one read: the connection's timer stops at their first byte and
    none is set for them."""
    protocol, transport = connect(protocol_for(5.0), answer, b"")
    assert protocol._read_timer is not None  # the connection's, till a request begins
    protocol.loop = timers = TimerCount(protocol.loop)
    protocol.data_received(POST)
    assert protocol._read_timer is None and timers.set == 0
    await wait_until(lambda: protocol.cycle.response_complete, "the response")
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK")


async def test_a_request_in_pieces_is_timed_from_its_first_byte() -> None:
    """Its bound is not moved by what comes later: a client trickling bytes is cut off at the
    same moment as one that stalls."""
    loop = asyncio.get_running_loop()
    protocol, _ = connect(protocol_for(5.0), answer, b"")
    started = loop.time()
    protocol.data_received(POST[:10])
    timer = protocol._read_timer
    assert timer is not None and started + 5.0 <= timer.when() <= loop.time() + 5.0
    await asyncio.sleep(0.01)
    protocol.data_received(POST[10:20])
    assert protocol._read_timer is timer and not timer.cancelled()
    protocol.data_received(POST[20:])
    assert timer.cancelled() and protocol._read_timer is None


async def test_a_request_that_arrives_in_time_is_not_cut_off_while_the_app_works() -> None:
    async def slow(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.sleep(0.15)  # longer than the read bound: the app's time does not count
        await answer(scope, receive, send)

    protocol, transport = connect(protocol_for(0.05), slow)
    await wait_until(lambda: protocol.cycle.response_complete, "the response")
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK") and "close" not in transport.events


@pytest.mark.parametrize(("path", "error"), [
    (b"/predict", b'{"error":{"type":"headers_too_large","message":"the request\'s line and '
                  b'headers are over 65536 bytes"}}'),
    (b"/v2/models/linear/infer", b'{"error":"the request\'s line and headers are over 65536 '
                                 b'bytes"}'),
])
async def test_headers_past_the_bound_get_431_and_the_connection_is_closed(
        path: bytes, error: bytes) -> None:
    head = b"POST " + path + b" HTTP/1.1\r\nx-big: "
    protocol, transport = connect(OneWriteProtocol, answer, head)
    value = b"a" * (MAX_HEAD_BYTES - len(head))
    for at in range(0, len(value), 4096):  # the head grows to the bound, in pieces
        protocol.data_received(value[at:at + 4096])
    assert transport.events == [] and protocol.cycle is None  # at the bound: still reading
    protocol.data_received(b"a")
    (written,) = transport.writes
    assert written.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert written.endswith(b"\r\n\r\n" + error) and transport.events[-1] == "close"


@pytest.mark.parametrize("body", [b"", b"{}" * MAX_HEAD_BYTES])
async def test_a_head_past_the_bound_in_one_read_gets_431_and_reaches_no_app(body: bytes
                                                                              ) -> None:
    reached: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope)
        await answer(scope, receive, send)

    request = b"POST /predict HTTP/1.1\r\nx-big: %s\r\ncontent-length: %d\r\n\r\n%s" % (
        b"a" * MAX_HEAD_BYTES, len(body), body)
    _, transport = connect(OneWriteProtocol, app, request)  # the whole request in one read
    await asyncio.sleep(0)
    (written,) = transport.writes  # the 431 alone, no 400 after it
    assert written.startswith(b"HTTP/1.1 431 ") and transport.events[-1] == "close"
    assert reached == []


@pytest.mark.parametrize(("coding", "named"), [(b"gzip, chunked", "gzip"),
                                                (b"X-Custom ,Chunked", "x-custom")])
async def test_a_transfer_coding_other_than_chunked_gets_501_and_reaches_no_app(
        coding: bytes, named: str) -> None:
    """llhttp takes codings before a final chunked and hands the body on still in them: the
    app would read gzip bytes as if they were the body."""
    reached: list[Any] = []
    counted: list[tuple[int, str]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope)
        await answer(scope, receive, send)

    request = (b"POST /v2/models/m/infer HTTP/1.1\r\ntransfer-encoding: %s\r\n\r\n"
               b"2\r\n{}\r\n0\r\n\r\n")
    counting = protocol_for(5.0, lambda status, kind, _: counted.append((status, kind)))
    _, transport = connect(counting, app, request % coding)
    await asyncio.sleep(0)
    (written,) = transport.writes
    assert written.startswith(b"HTTP/1.1 501 Not Implemented\r\n")
    assert written.endswith(f"Transfer-Encoding '{named}' is not one this server takes: chunked "
                            "only (gzip and deflate go in Content-Encoding)\"}".encode())
    assert transport.events[-1] == "close" and reached == []
    assert counted == [(501, "transfer_coding")]
    transport = await exchange(OneWriteProtocol, answer, request % b"chunked")
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK")


async def test_bodies_and_many_requests_on_a_connection_are_not_counted_as_headers() -> None:
    body = b"[" + b"1," * MAX_HEAD_BYTES + b"1]"  # past the bound, as a body
    request = b"POST /predict HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (
        len(body), body)
    transport = await exchange(OneWriteProtocol, answer, request)
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK")
    protocol, transport = connect(OneWriteProtocol, answer)
    head = b"POST /predict HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * 40000 + b"\r\n"
    for _ in range(3):  # each head under the bound, together past it
        await wait_until(lambda: protocol.cycle.response_complete, "the response")
        protocol.data_received(head + b"content-length: 2\r\n\r\n{}")
    await wait_until(lambda: protocol.cycle.response_complete, "the response")
    assert [w[:15] for w in transport.writes] == [b"HTTP/1.1 200 OK"] * 4


async def test_the_bound_holds_for_each_request_of_a_connection() -> None:
    protocol, transport = connect(OneWriteProtocol, answer)
    await wait_until(lambda: protocol.cycle.response_complete, "the first response")
    protocol.data_received(b"POST /predict HTTP/1.1\r\nx-big: " + b"a" * MAX_HEAD_BYTES)
    assert transport.writes[-1].startswith(b"HTTP/1.1 431 ") and transport.events[-1] == "close"


class Gate:
    """An app answering as ``answer`` does, a request for each ``let`` through, keeping the
    exceptions its sends raised."""

    def __init__(self) -> None:
        self.passes = asyncio.Semaphore(0)
        self.raised: list[BaseException] = []

    def let(self, n: int) -> None:
        for _ in range(n):
            self.passes.release()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.passes.acquire()
        try:
            await answer(scope, receive, send)
        except BaseException as exc:
            self.raised.append(exc)
            raise


class StrictTransport(Transport):
    """As uvloop's: a write after the close raises."""

    def write(self, data: bytes) -> None:
        if self.is_closing():
            raise RuntimeError("unable to perform operation: the handler is closed")
        super().write(data)

    def writelines(self, parts: list[bytes]) -> None:
        self.write(b"".join(parts))


def open_connection(app: Any, transport: Transport) -> OneWriteProtocol:
    config = Config(app, http=OneWriteProtocol, lifespan="off", log_config=None)
    config.load()
    protocol = OneWriteProtocol(config=config, server_state=ServerState(), app_state={})
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return protocol


async def test_what_a_cycle_sends_after_its_connection_closed_is_dropped() -> None:
    """A request pipelined after one still running is bytes no request begins with: uvicorn
    answers 400 and closes; the running one's answer is dropped, not written to the closed
    socket (uvloop raised there, and the app's error answer after it: two tracebacks)."""
    gate, transport = Gate(), StrictTransport()
    protocol = open_connection(gate, transport)
    protocol.data_received(POST + b"GARBAGE GARBAGE\r\n\r\n")
    assert transport.writes[0].startswith(b"HTTP/1.1 400 ") and transport.is_closing()
    gate.let(1)
    await wait_until(lambda: not protocol.tasks, "the running request done")
    assert gate.raised == [] and len(transport.writes) == 1


async def test_reads_stay_paused_while_many_pipelined_requests_wait() -> None:
    """uvicorn resumed reading at every answer: a client pipelining without reading its
    answers made the server hold all it sent."""
    gate, transport = Gate(), Transport()
    protocol = open_connection(gate, transport)
    protocol.data_received(POST * 100)  # the first runs, 99 wait in the pipeline
    assert protocol.flow.read_paused
    gate.let(10)
    await wait_until(lambda: len(transport.writes) == 10, "ten answered")
    assert len(protocol.pipeline) >= PIPELINE_LIMIT and protocol.flow.read_paused
    gate.let(90)
    await wait_until(lambda: len(transport.writes) == 100, "every request answered")
    assert not protocol.flow.read_paused  # resumed once the pipeline was short


async def test_a_running_request_whose_client_left_hears_it_with_one_pipelined_behind(
        ) -> None:
    """uvicorn told only the last request parsed: with a pipelined request waiting, the
    running one's wait for a disconnect (as the inference routes watch) never ended, and its
    work was done and counted answered for a client long gone."""
    heard: list[str] = []

    async def watching(scope: Any, receive: Any, send: Any) -> None:
        await receive()  # the body
        heard.append((await receive())["type"])

    protocol, transport = connect(OneWriteProtocol, watching, POST * 2)
    await wait_until(lambda: protocol.tasks and protocol.pipeline, "one running, one waiting")
    protocol.connection_lost(ConnectionResetError())
    await wait_until(lambda: heard, "the running request's receive")
    assert heard == ["http.disconnect"] and transport.writes == []


async def test_bytes_that_are_no_request_get_one_400_alone() -> None:
    _, transport = connect(OneWriteProtocol, answer, b"\x16\x03\x01" * MAX_HEAD_BYTES)
    (written,) = transport.writes  # no 431 after it
    assert written.startswith(b"HTTP/1.1 400 ") and transport.events[-1] == "close"


async def echo(scope: Any, receive: Any, send: Any) -> None:
    """Answers the request's body."""
    body = b""
    while (message := await receive())["type"] == "http.request":
        body += message["body"]
        if not message["more_body"]:
            break
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


H2C = (b"POST /predict HTTP/1.1\r\nhost: x\r\nconnection: Upgrade, HTTP2-Settings\r\n"
       b"upgrade: h2c\r\nhttp2-settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n")


@pytest.mark.parametrize("framing", [
    b"content-length: 7\r\n\r\n{\"a\":1}",
    b"transfer-encoding: chunked\r\n\r\n3\r\n{\"a\r\n4\r\n\":1}\r\n0\r\n\r\n",
])
async def test_a_declined_upgrade_keeps_its_body_and_the_connection(framing: bytes) -> None:
    """curl --http2 and Spring's RestClient ask for h2c: llhttp ends such a request at its
    headers, and uvicorn gave the app an empty body."""
    request = H2C + framing
    protocol, transport = connect(OneWriteProtocol, echo, request[:70])
    for at in range(70, len(request), 9):  # the rest in small pieces
        protocol.data_received(request[at:at + 9])
    await wait_until(lambda: protocol.cycle.response_complete, "the response")
    protocol.data_received(POST)  # a next request on the connection
    await wait_until(lambda: len(transport.writes) == 2 and protocol.cycle.response_complete,
                     "the second response")
    first, second = transport.writes
    assert first.startswith(b"HTTP/1.1 200 OK") and first.endswith(b'\r\n\r\n{"a":1}')
    assert second.endswith(b"\r\n\r\n{}") and "close" not in transport.events


@pytest.mark.parametrize(("request_", "error"), [
    (b"\x16\x03\x01\x00\xa5",  # a TLS hello: no path, the default format
     b'{"error":{"type":"invalid_http","message":"the request is not valid HTTP/1.1: '
     b'Invalid method encountered"}}'),
    (b"POST /predict HTTP/1.1\r\nhost: a\x01b\r\n\r\n",
     b'{"error":{"type":"invalid_http","message":"the request is not valid HTTP/1.1: '
     b'Invalid header value char"}}'),
    (b"POST /v2/models/m/infer HTTP/1.1\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
     b'{"error":"the request is not valid HTTP/1.1: Duplicate Content-Length"}'),
    (b"CONNECT 127.0.0.1:22 HTTP/1.1\r\nhost: a\r\n\r\n",  # llhttp: "User callback error"
     b'{"error":{"type":"invalid_http","message":"the request is not valid HTTP/1.1: '
     b"its target is not a path: invalid url b'127.0.0.1:22'\"}}"),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",  # a gRPC client on this port: "Pause on PRI/Upgrade"
     b'{"error":{"type":"invalid_http","message":"the request is not valid HTTP/1.1: '
     b'it is HTTP/2; this port serves HTTP/1.1 (gRPC has a port of its own, grpc_port)"}}'),
    (H2C + b"transfer-encoding: chunked\r\n\r\nzz\r\n",  # read past llhttp (app/framing.py)
     b'{"error":{"type":"invalid_http","message":"the request is not valid HTTP/1.1: '),
])
async def test_a_request_that_is_not_http_gets_400_saying_why_in_its_paths_format(
        request_: bytes, error: bytes) -> None:
    """As the other answers the protocol gives itself: JSON in the route's format, where
    uvicorn answered a line of plain text, 'Invalid HTTP request received.'."""
    _, transport = connect(OneWriteProtocol, answer, request_)
    (written,) = transport.writes
    assert written.startswith(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json")
    assert error in written and transport.events[-1] == "close"


async def test_requests_on_a_kept_connection_leave_the_garbage_collector_nothing() -> None:
    """Each answer's objects are freed as it ends, as uvicorn's own are: a reference cycle a
    request (a response's transport that held its cycle) left every request's scope, cycle and
    messages to the collector, which took 4 us a request more."""
    protocol, transport = connect(OneWriteProtocol, answer)
    await wait_until(lambda: protocol.cycle.response_complete, "the first response")
    gc.collect()
    gc.disable()
    try:
        for _ in range(20):
            protocol.data_received(POST)
            await wait_until(lambda: protocol.cycle.response_complete, "the response")
        assert gc.collect() == 0
    finally:
        gc.enable()
    assert len(transport.writes) == 21


@pytest.mark.parametrize("protocol_class", [HttpToolsProtocol, OneWriteProtocol])
async def test_a_client_slow_to_read_gets_the_answer_whole_once_it_reads(
        protocol_class: type[HttpToolsProtocol]) -> None:
    """While the socket's buffer is full (uvicorn's flow paused for writing) a response waits;
    when the client has read, it goes out whole, the same bytes as uvicorn's."""
    config = Config(answer, http=protocol_class, lifespan="off", log_config=None)
    config.load()
    protocol = protocol_class(config=config, server_state=ServerState(), app_state={})
    transport = Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    protocol.pause_writing()
    protocol.data_received(POST)
    await asyncio.sleep(0.01)
    assert transport.writes == []  # the answer waits for the client
    protocol.resume_writing()
    await wait_until(lambda: protocol.cycle.response_complete, "the response")
    theirs = await exchange(HttpToolsProtocol, answer, POST)
    assert b"".join(transport.writes) == b"".join(theirs.writes)
    assert len(transport.writes) == (1 if protocol_class is OneWriteProtocol else 2)


async def test_a_reset_connection_lets_go_of_its_keep_alive_timer() -> None:
    """uvicorn cancels the timer that closes an idle connection on a clean close only: after
    a reset it would hold the protocol and its last request for ``keep_alive_s``."""
    protocol, _ = connect(protocol_for(5.0), answer)
    await wait_until(lambda: protocol.cycle.response_complete, "the response")
    timer = protocol.timeout_keep_alive_task
    assert timer is not None and not timer.cancelled()
    protocol.connection_lost(ConnectionResetError())
    assert timer.cancelled() and protocol.timeout_keep_alive_task is None


async def test_what_the_protocol_answers_itself_is_counted_once_and_nothing_else() -> None:
    """Requests answered before any app saw them (no route counts those) are counted with
    their status and reason: too slow in their head, not HTTP, a head too large, past the
    connection limit. A request the app is reading, a served one and a connection that never
    sent anything are not."""
    counted: list[tuple[int, str]] = []

    def count(status: int, reason: str, seconds: float) -> None:
        assert seconds >= 0
        counted.append((status, reason))

    counting = protocol_for(0.05, count)

    async def reading(scope: Any, receive: Any, send: Any) -> None:
        while (await receive())["type"] == "http.request":
            pass

    stalled = [connect(counting, answer, b"POST /predict HTTP/1.1\r\nhost: x\r\ncontent-le"),
               connect(counting, reading, POST.replace(b"length: 2", b"length: 9")),
               connect(counting, answer, b"")]
    for _, transport in stalled:
        await wait_until(lambda t=transport: "close" in t.events, "the connection cut off")
    assert counted == [(408, "request_timeout")]

    served, transport = connect(counting, answer)
    await wait_until(lambda: served.cycle.response_complete, "the response")
    connect(counting, answer, b"\x16\x03\x01" * 100)
    head, _ = connect(counting, answer, b"POST /predict HTTP/1.1\r\nx-big: ")
    head.data_received(b"a" * MAX_HEAD_BYTES)
    assert counted[1:] == [(400, "invalid_http"), (431, "headers_too_large")]

    config = Config(answer, http=counting, lifespan="off", log_config=None, limit_concurrency=1)
    config.load()
    state = ServerState()
    for request in (b"", POST):  # the first connection holds the one place
        protocol = counting(config=config, server_state=state, app_state={})
        protocol.connection_made(Transport())  # type: ignore[arg-type]
        protocol.data_received(request)
    await wait_until(lambda: protocol.cycle.response_complete, "the 503")
    assert counted[3:] == [(503, "connections")]


@pytest.mark.parametrize(("path", "error"), [
    (b"/predict", b'{"error":{"type":"busy","message":"the process holds as many connections '
                  b'and requests as max_connections lets it"}}'),
    (b"/v2/models/m/infer", b'{"error":"the process holds as many connections and requests '
                            b'as max_connections lets it"}'),
])
async def test_a_request_past_max_connections_gets_busy_with_retry_after(path: bytes,
                                                                         error: bytes) -> None:
    """As a full queue's 503, in the path's error format, where uvicorn answered a plain-text
    'Service Unavailable' a client could not tell from the gateway's, with no Retry-After."""
    config = Config(answer, http=OneWriteProtocol, lifespan="off", log_config=None,
                    limit_concurrency=1)
    config.load()
    state = ServerState()
    for request in (b"", POST.replace(b"/predict", path)):  # the first holds the one place
        protocol = OneWriteProtocol(config=config, server_state=state, app_state={})
        transport = Transport()
        protocol.connection_made(transport)  # type: ignore[arg-type]
        protocol.data_received(request)
    await wait_until(lambda: protocol.cycle.response_complete, "the 503")
    (written,) = transport.writes
    head, body = written.split(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b"\r\nretry-after: 1\r\n" in head and b"\r\nconnection: close" in head
    assert b"\r\ncontent-type: application/json" in head and body == error
    assert transport.events[-1] == "close"


WEBSOCKET = (b"GET /health_check HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\n"
             b"upgrade: websocket\r\nsec-websocket-version: 13\r\n"
             b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")


@pytest.mark.parametrize("ws", ["none", "websockets-sansio"])
async def test_a_websocket_upgrade_is_declined_or_handed_over_never_a_400(ws: str) -> None:
    """batchserve serves no WebSocket (``ws="none"``, app/draining.py): the upgrade is
    declined and the request answered in HTTP/1.1. Where uvicorn serves them, the connection
    goes to its WebSocket protocol (the head held for no cycle once made a 400)."""
    config = Config(answer, http=OneWriteProtocol, lifespan="off", log_config=None, ws=ws)
    config.load()
    protocol = OneWriteProtocol(config=config, server_state=ServerState(), app_state={})
    transport = Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    protocol.data_received(WEBSOCKET)
    if ws == "none":
        await wait_until(lambda: protocol.cycle.response_complete, "the response")
        (written,) = transport.writes
        assert written.startswith(b"HTTP/1.1 200 OK") and "close" not in transport.events
    else:
        assert transport.writes == [] and "WebSocket" in type(transport.events[-1]).__name__


CHUNKED = (b"POST /predict HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
           b"2\r\n{}\r\n")


async def test_trailers_past_the_head_bound_get_431_and_are_not_gathered() -> None:
    """httptools gathers a trailer whole before it hands it on: 150 MB of one took 230 MB and
    seconds of the loop, till the read timeout. Past MAX_HEAD_BYTES the request is cut off."""
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while (message := await receive())["type"] == "http.request" and message["more_body"]:
            pass
        seen.append(message["type"])

    protocol, transport = connect(OneWriteProtocol, app, CHUNKED + b"0\r\nx-t: ")
    piece = b"y" * 16384
    for _ in range(MAX_HEAD_BYTES // len(piece) + 1):
        assert "close" not in transport.events
        protocol.data_received(piece)
    await wait_until(lambda: "close" in transport.events, "the connection closed")
    (written,) = transport.writes
    assert written.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert written.endswith(b"the request's trailers are over 65536 bytes\"}}")
    protocol.connection_lost(None)
    await wait_until(lambda: seen, "the app done")
    assert seen == ["http.disconnect"]
    assert protocol.scope[CUT_OFF] == (431, "headers_too_large")  # the app counts it so


async def test_a_chunked_body_in_any_reads_with_small_trailers_is_served() -> None:
    """Only reads with none of the body count toward the trailers' bound: a body whose chunks
    and reads fall anyhow is not refused for the reads that carried it."""
    got: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while (message := await receive())["type"] == "http.request":
            body += message.get("body", b"")
            if not message["more_body"]:
                break
        got.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    body = bytes(range(256)) * 2048  # 512 KiB in chunks of 100 KiB
    parts = [body[i:i + 102400] for i in range(0, len(body), 102400)]
    wire = (b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
            + b"0\r\nx-checksum: " + b"c" * 1000 + b"\r\n\r\n")
    head, _ = CHUNKED.split(b"2\r\n", 1)
    protocol, transport = connect(OneWriteProtocol, app, head)
    at = 0
    for size in [6, 102400, 3, 65536, 200000, 1, 7] * 20:  # reads ending inside chunk headers
        protocol.data_received(wire[at:at + size])
        at += size
        if at >= len(wire):
            break
    await wait_until(lambda: protocol.cycle.response_complete, "the response")
    assert got == [body] and transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
