"""app/draining.py: the server's drain phase and its start-up line."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from dataclasses import dataclass
from typing import Any

import pytest
import uvicorn

from app import draining
from app.accepting import Acceptor
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


def said(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records]


async def test_a_drain_says_when_it_starts_and_when_every_request_is_answered(
        caplog: pytest.LogCaptureFixture) -> None:
    service = Service(False, "ready", in_flight=2)
    server = DrainingServer(uvicorn.Config(app=None), service, 35.0)
    server._frozen = True  # past start-up
    server.started = True
    server.handle_exit(15, None)
    with caplog.at_level(logging.INFO, logger="batchserve"):
        assert not await server.on_tick(1)
        assert not await server.on_tick(2)  # said once
        service.in_flight = 0
        assert await server.on_tick(3)
    assert said(caplog)[0] == (
        "INFO", "draining: new requests refused; answering the 2 in flight, within 35 s at most")
    assert len(said(caplog)) == 2 and said(caplog)[1][1].startswith("drained in ")


async def test_a_drain_whose_time_is_over_warns_of_the_requests_unanswered(
        caplog: pytest.LogCaptureFixture) -> None:
    """The drain limit passes with requests in flight (a model call stuck): the server shuts
    down, and the log says how many were unanswered; a front end's lines name it."""
    service = Service(False, "ready", in_flight=3)
    server = DrainingServer(uvicorn.Config(app=None), service, 35.0, role="front end 7")
    server._frozen = server.started = True
    server.handle_exit(15, None)
    assert server.drain_started is not None
    server.drain_started -= 36.0
    with caplog.at_level(logging.INFO, logger="batchserve"):
        assert await server.on_tick(1)
    assert said(caplog) == [("WARNING", "front end 7: 3 requests unanswered when the drain's "
                                        "35 s were over; shutting down")]


async def test_a_second_signal_ends_the_drain(caplog: pytest.LogCaptureFixture) -> None:
    service = Service(False, "ready", in_flight=1)
    server = DrainingServer(uvicorn.Config(app=None), service, 35.0)
    server._frozen = server.started = True
    server.handle_exit(15, None)
    with caplog.at_level(logging.INFO, logger="batchserve"):
        assert not await server.on_tick(1)
        server.handle_exit(15, None)
        assert await server.on_tick(2)
    assert said(caplog)[-1] == (
        "INFO", "drain ended by a second signal; shutting down with 1 in flight")


async def test_a_front_ends_drain_asked_after_its_own_signal_goes_on_till_asked_to_end() -> None:
    """A signal to every process of the server reaches a front end itself and through its device
    process's DRAIN: the drain goes on (its port open, new requests refused 503); END_DRAIN, the
    device process's second signal or its drain's end, ends it."""
    service = Service(False, "ready", in_flight=1)
    server = DrainingServer(uvicorn.Config(app=None), service, 35.0, role="front end 7",
                            asked=True)
    server._frozen = server.started = True
    server.handle_exit(15, None)
    server.drain_asked()
    assert not await server.on_tick(1) and service.status == "draining"
    server.end_asked()
    assert await server.on_tick(2)


async def test_a_front_ends_own_signal_after_its_drain_was_asked_does_not_end_it() -> None:
    """The same signals in the other order (Python runs SIGUSR1's handler before SIGTERM's
    when both wait): the drain goes on till a second signal of its own, or END_DRAIN."""
    service = Service(False, "ready", in_flight=1)
    server = DrainingServer(uvicorn.Config(app=None), service, 35.0, asked=True)
    server._frozen = server.started = True
    server.drain_asked()
    server.handle_exit(15, None)
    assert not await server.on_tick(1) and service.status == "draining"
    server.handle_exit(15, None)
    assert await server.on_tick(2)


async def test_a_front_end_asked_to_drain_drains_as_on_a_signal() -> None:
    service = Service(False, "ready", in_flight=1)
    server = DrainingServer(uvicorn.Config(app=None), service, 35.0, asked=True)
    server._frozen = server.started = True
    server.drain_asked()
    assert server.drain_started is not None and service.status == "draining"
    assert not await server.on_tick(1)
    service.in_flight = 0
    assert await server.on_tick(2)


async def test_only_a_front_end_takes_the_device_process_asks() -> None:
    for asked in (False, True):
        server = DrainingServer(uvicorn.Config(app=None), Service(False, "ready"), 35.0,
                                asked=asked)
        with server.capture_signals():
            taken = {draining.DRAIN: signal.getsignal(draining.DRAIN),
                     draining.END_DRAIN: signal.getsignal(draining.END_DRAIN)}
            assert signal.getsignal(signal.SIGTERM) == server.handle_exit
        expected = ({draining.DRAIN: server.drain_asked, draining.END_DRAIN: server.end_asked}
                    if asked else {draining.DRAIN: signal.SIG_DFL,
                                   draining.END_DRAIN: signal.SIG_DFL})
        assert taken == expected
        assert signal.getsignal(draining.DRAIN) == signal.SIG_DFL


async def test_its_sockets_are_served_by_acceptors_and_closed_at_shutdown() -> None:
    """Each socket the server is given is accepted by an Acceptor (app/accepting.py), whose
    connections uvicorn's protocol serves; shutdown closes the port."""

    async def hello(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"hi"})

    config = uvicorn.Config(app=hello, lifespan="off", log_config=None)
    config.load()
    server = DrainingServer(config, Service(False, "ready"), 35.0)
    server.lifespan = config.lifespan_class(config)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    await server.startup([listener])
    assert [type(s) for s in server.servers] == [Acceptor]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    answer = await reader.read()
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"hi")
    await server.shutdown([listener])
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)
