"""Accepting a listening socket's connections: all that wait, each time the event loop finds
the socket readable.

uvicorn serves a socket through the event loop's own server, and uvloop's (libuv's, since its
1.45) accepts one connection each time the socket polls readable: one a pass of the loop. A busy
loop's pass takes tens of milliseconds, so a burst of new connections to a busy server waited a
pass for each connection ahead of it: up to 1.7 s for the last of 200 health probes beside 256
busy clients (`python -m bench.accepts`; the figures: docs/operations.md, "Overload"). The
standard library's loop accepts all that wait (up to its backlog), as ``Acceptor`` does; each
connection, Nagle's algorithm off as uvloop's server sets it, is then the loop's, through
``connect_accepted_socket``.

Out of descriptors (EMFILE, ENFILE) the connections waiting are closed unanswered, with a
descriptor held in reserve for it, as libuv does, rather than left to hang in the backlog.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
from collections.abc import Callable

from app.listening import BACKLOG

ACCEPT_AT_ONCE = BACKLOG  # the most one readable event accepts: as many as may wait


class Acceptor:
    """Hands every connection ``sock`` accepts to the running loop with a protocol from
    ``protocol_factory``; ``close`` and ``wait_closed`` as an ``asyncio.Server``'s, which
    uvicorn's shutdown calls."""

    def __init__(self, sock: socket.socket,
                 protocol_factory: Callable[[], asyncio.Protocol]) -> None:
        self._sock = sock
        self._factory = protocol_factory
        self._loop = asyncio.get_running_loop()
        self._reserve: int | None = os.open(os.devnull, os.O_RDONLY)
        self._tasks: set[asyncio.Task[None]] = set()
        # Nagle's algorithm off on TCP: small answers not held for an acknowledgement.
        self._nodelay = sock.family != socket.AF_UNIX
        sock.setblocking(False)
        self._loop.add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        for _ in range(ACCEPT_AT_ONCE):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return  # none waits
            except ConnectionAbortedError:  # reset while it waited
                continue
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    self._shed()
                return  # anything else (ENOBUFS, ENOMEM...): again when next readable
            if self._nodelay:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = self._loop.create_task(self._serve(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, conn)
        except OSError:  # the client left before its transport was made
            conn.close()

    def _shed(self) -> None:
        """Out of descriptors: the connections waiting are closed unanswered, through the
        descriptor held in reserve, which is taken back after."""
        if self._reserve is None:
            return
        os.close(self._reserve)
        self._reserve = None
        try:
            for _ in range(ACCEPT_AT_ONCE):
                self._sock.accept()[0].close()
        except OSError:  # none waits (or descriptors ran out again)
            pass
        with contextlib.suppress(OSError):
            self._reserve = os.open(os.devnull, os.O_RDONLY)

    def close(self) -> None:
        """Stop accepting and close the socket (this process's descriptor of it)."""
        if self._sock.fileno() != -1:
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None

    async def wait_closed(self) -> None:
        """The connections accepted are the protocols' to close (uvicorn's shutdown waits for
        them); the socket is closed by then."""
