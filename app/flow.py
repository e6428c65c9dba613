"""A connection's flow control as batchserve serves HTTP (app/connection.py): bounds that a
client cannot pass by not reading.

uvicorn pauses a connection's reads while a pipelined request waits, but every request it
starts or answers resumes them, and it writes an answer into the transport's buffer whatever
the client takes of it. A client that pipelined without reading made the server hold every
request it sent (635 MB for one client's 28 MB of requests); one that sends a small request
for a large answer and never reads held the answer's bytes and the connection for as long as
it stayed connected (a connection's keep-alive close waits for its buffer to empty), so a few
hundred such connections held gigabytes and every place under ``max_connections``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import struct
import termios
from collections.abc import Callable, Sized
from typing import Any

from uvicorn.protocols.http.flow_control import FlowControl

# The most pipelined requests a connection may have waiting before its reads pause.
PIPELINE_LIMIT = 32

# SO_LINGER on, for 0 s: a close resets the connection, dropping what the kernel still holds
# for it, rather than sending it on to a client that takes nothing.
RESET_ON_CLOSE = struct.pack("ii", 1, 0)


class ConnectionFlow(FlowControl):
    """uvicorn's flow control, whose reads stay paused while the connection has
    ``PIPELINE_LIMIT`` pipelined requests waiting, and whose writes, once paused (the
    transport's buffer past its high-water mark), must make progress: where a ``stall_s``
    passes in which the client took none of what waits, ``on_stall`` is called (the
    connection is to be reset: ``reset``)."""

    def __init__(self, transport: Any, pipeline: Sized, stall_s: float | None,
                 on_stall: Callable[[], None]) -> None:
        """``stall_s``: the bound (the protocol's is ``read_timeout_s``, ``SLOW_LINK_S`` at
        least); None: none."""
        super().__init__(transport)
        self._pipeline = pipeline
        self._stall_s = stall_s
        self._on_stall = on_stall
        self._timer: asyncio.TimerHandle | None = None
        self._unsent = 0  # the buffer's size when the timer was set

    def resume_reading(self) -> None:
        """uvicorn's (its body here: called two or three times a request, a ``super()`` call
        each), unless ``PIPELINE_LIMIT`` requests wait."""
        if self.read_paused and len(self._pipeline) < PIPELINE_LIMIT:
            self.read_paused = False
            self._transport.resume_reading()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall_s is not None and self._timer is None:
            self._watch()

    def resume_writing(self) -> None:
        super().resume_writing()  # also on connection_lost: the timer goes with it
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _watch(self) -> None:
        assert self._stall_s is not None
        self._unsent = unsent(self._transport)
        self._timer = asyncio.get_running_loop().call_later(self._stall_s, self._check)

    def _check(self) -> None:
        """Writes are still paused: go on watching if the client took some, else stall."""
        self._timer = None
        if unsent(self._transport) < self._unsent:
            self._watch()
        else:
            self._on_stall()


def unsent(transport: Any) -> int:
    """The bytes written to ``transport`` that its client has not taken: those in its buffer
    and those the kernel holds (TIOCOUTQ: sent and not acknowledged, or not sent). The buffer
    alone moves in steps of a third of the kernel's (megabytes; the socket is writable again
    only then), so a client that reads slowly but steadily would seem to take nothing."""
    held = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    if sock is None:
        return int(held)
    try:
        queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except OSError:
        return int(held)
    return int(held) + int.from_bytes(queued, "little", signed=True)


def reset(transport: Any) -> None:
    """Close ``transport`` at once, its buffer dropped, with a reset (``RESET_ON_CLOSE``)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):  # closed under us: abort drops the buffer anyway
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
    transport.abort()
