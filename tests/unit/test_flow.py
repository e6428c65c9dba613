"""ConnectionFlow: a connection whose client stops taking its answer is found and reset."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from app.flow import ConnectionFlow, reset, unsent
from tests.conftest import wait_until

pytestmark = pytest.mark.asyncio


class Transport:
    """A transport whose buffer holds ``held`` bytes, less ``taken`` each time it is asked."""

    def __init__(self, held: int, taken: int = 0, sock: socket.socket | None = None) -> None:
        self.held, self.taken, self.sock = held, taken, sock
        self.aborted = False

    def get_write_buffer_size(self) -> int:
        self.held -= self.taken
        return self.held

    def get_extra_info(self, name: str) -> Any:
        return self.sock if name == "socket" else None

    def abort(self) -> None:
        self.aborted = True


def flow_of(transport: Transport, stall_s: float | None) -> tuple[ConnectionFlow, list[int]]:
    stalls: list[int] = []
    return ConnectionFlow(transport, [], stall_s, lambda: stalls.append(1)), stalls


async def test_writes_paused_with_nothing_taken_for_the_bound_stall() -> None:
    flow, stalls = flow_of(Transport(1 << 20), 0.01)
    flow.pause_writing()
    await wait_until(lambda: stalls, "the stall")
    assert stalls == [1] and flow.write_paused


async def test_a_client_that_takes_some_each_time_never_stalls() -> None:
    transport = Transport(1 << 20, taken=1)  # less at every look, however late it comes
    flow, stalls = flow_of(transport, 0.001)
    flow.pause_writing()
    await wait_until(lambda: transport.held < (1 << 20) - 20, "ten looks at the buffer")
    assert stalls == []
    flow.resume_writing()  # drained below the low-water mark: no more looks
    held = transport.held
    await asyncio.sleep(0.05)
    assert transport.held == held and stalls == []


async def test_without_a_bound_a_paused_connection_is_never_stalled() -> None:
    transport = Transport(1 << 20)
    flow, stalls = flow_of(transport, None)
    flow.pause_writing()
    await asyncio.sleep(0.02)
    assert flow.write_paused and stalls == [] and transport.held == 1 << 20  # never looked


async def test_what_the_kernel_holds_counts_as_unsent_and_a_reset_drops_it() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    accepted, _ = server.accept()
    accepted.setblocking(False)
    sent = 0
    try:
        while True:
            sent += accepted.send(b"x" * 65536)
    except BlockingIOError:  # the kernel holds all it will: the client reads nothing
        pass
    transport = Transport(1000, sock=accepted)
    assert 1000 < unsent(transport) <= 1000 + sent  # the buffer, and what the kernel holds
    transport.abort = accepted.close  # type: ignore[method-assign]
    reset(transport)
    with pytest.raises(ConnectionResetError):
        while client.recv(65536):
            pass
    for sock in (client, server):
        sock.close()
