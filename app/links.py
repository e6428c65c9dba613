"""The two ends of a link between a front end and the device process: what one reads
(``Inbox``) and what one sends (``Outbox``), in the format of app/wire.py.

An inbox is an asyncio buffered protocol: the kernel writes short messages into one scratch
buffer, from which each is copied once into a buffer of its own, and a long one straight into
its own buffer, with no copy at all. asyncio's stream reader copied every byte four times (the
loop's read, the stream's buffer, ``readexactly``, a writable copy): for messages of 64 KiB
requests that was about 40 % of the device process's CPU a request (``python -m bench.ipc
--per-message 8 --width 16384``). Messages go out as ``writelines`` of the header and the
frames, which uvloop sends in one ``writev`` without joining them.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Callable
from typing import Any, cast

from app.wire import GROUPED, PREFIX, decode, encode, pack

# An inbox's scratch buffer: messages that fit are read into it, longer ones into their own.
SCRATCH_BYTES = 256 * 2**10
# Messages an inbox holds unread before it stops reading its socket (it reads again at half).
HELD_MESSAGES = 64
# How long entries added with ``hold`` (a front end's request counts) are gathered: then they
# go with the next message, or alone after ``HELD_ALONE_S``. The device process counts about 20
# lists a second per model and status from each front end, not one with each message it reads,
# and no message goes for them alone while others go (a scrape of /metrics asks for them at
# once, app/bridge.py). Short, since a front end killed with SIGKILL loses what it holds.
HOLD_S = 0.05
HELD_ALONE_S = 0.05  # how long after HOLD_S held entries wait for a message before going alone


async def connect(sock: socket.socket) -> tuple[Inbox, asyncio.Transport]:
    """One end of a link on a connected socket: what it reads, and the transport it writes to."""
    transport, inbox = await asyncio.get_running_loop().create_connection(Inbox, sock=sock)
    return inbox, transport


class Inbox(asyncio.BufferedProtocol):
    """The messages one end of a link reads, in order (``read``), each in a buffer of its own
    (writable: its arrays are views of it)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._scratch = bytearray(SCRATCH_BYTES)
        self._have = 0  # bytes in the scratch buffer, from a message's start
        self._long: bytearray | None = None  # a message too long for the scratch buffer
        self._filled = 0  # its bytes read so far
        self._layout = (0, 0)  # its pickle's length and frame count
        self._messages: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._paused = False

    async def read(self) -> Any:
        """The next message; ConnectionError once the peer has gone."""
        while not self._messages:
            if self._closed:
                raise ConnectionResetError("the link is closed")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        message = self._messages.popleft()
        if self._paused and len(self._messages) <= HELD_MESSAGES // 2:
            self._paused = False
            assert self.transport is not None
            self.transport.resume_reading()
        return message

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._wake()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._long is not None:
            return memoryview(self._long)[self._filled:]
        return memoryview(self._scratch)[self._have:]  # never empty: see buffer_updated

    def buffer_updated(self, nbytes: int) -> None:
        if self._long is not None:
            self._filled += nbytes
            if self._filled == len(self._long):
                body, self._long = self._long, None
                self._put(decode(body, *self._layout))
            return
        self._have += nbytes
        scratch, have, at = self._scratch, self._have, 0
        while have - at >= PREFIX.size:
            length, head_length, count = PREFIX.unpack_from(scratch, at)
            start = at + PREFIX.size
            if have - start >= length:  # whole: copied out of the scratch buffer
                self._put(decode(scratch[start:start + length], head_length, count))
                at = start + length
                continue
            if PREFIX.size + length > len(scratch):  # the rest is read into its own buffer
                self._long = bytearray(length)
                self._long[:have - start] = memoryview(scratch)[start:have]
                self._filled, self._layout = have - start, (head_length, count)
                at = have
            break
        if at:  # a partial message moves to the start, where there is room for all of it
            scratch[:have - at] = scratch[at:have]
            self._have = have - at

    def _put(self, message: Any) -> None:
        self._messages.append(message)
        if len(self._messages) >= HELD_MESSAGES and not self._paused:
            self._paused = True
            assert self.transport is not None
            self.transport.pause_reading()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class Outbox:
    """Collects what one pass of the event loop has to say to the peer and sends it as one
    message when the pass is done: many requests (or results) travel in one write. An entry
    may carry values (a request's items, its results): those of every entry of a kind travel
    packed together, under ``KIND_values``, in the entries' order."""

    def __init__(self, transport: asyncio.WriteTransport,
                 busy: Callable[[], bool] | None = None) -> None:
        self._transport = transport
        # While ``busy()`` says so, a message waits one more pass of the event loop: the
        # requests that pass reads go with it, in one message for the device process.
        self._busy = busy
        self._parts: dict[str, list[Any]] = {}
        self._values: dict[str, list[Any]] = {}
        self._groups: dict[str, dict[tuple[Any, ...], tuple[list[Any], list[Any]]]] = {}
        self._held_groups: dict[str, dict[tuple[Any, ...], tuple[list[Any], list[Any]]]] = {}
        self._due = False
        self._held: asyncio.TimerHandle | None = None  # ``group(hold=True)``'s timer
        self._ripe = False  # held entries go with the next message

    def add(self, kind: str, entry: Any, values: list[Any] | None = None) -> None:
        self._parts.setdefault(kind, []).append(entry)
        self._add_values(kind, values)

    def add_all(self, kind: str, entries: list[Any], values: list[Any]) -> None:
        """``add`` of several entries, ``values`` theirs in their order."""
        if entries:
            self._parts.setdefault(kind, []).extend(entries)
            self._add_values(kind, values)

    def _add_values(self, kind: str, values: list[Any] | None) -> None:
        """The values of the entries just added, and the message sent when this pass ends."""
        if values:
            self._values.setdefault(kind, []).extend(values)
        self._send_soon()

    def _send_soon(self) -> None:
        """This message goes at the end of this pass (``_pass_done``)."""
        if not self._due:
            self._due = True
            asyncio.get_running_loop().call_soon(self._pass_done)

    def group(self, kind: str, key: tuple[Any, ...], entry: Any,
              values: list[Any] | None = None, hold: bool = False) -> None:
        """Add ``entry`` to this message's one entry of ``kind`` for ``key``, ``(*key,
        [entries])``, and its ``values`` to that group's (``grouped_values``): a front end's
        requests travel one group per model version and level, its request durations one list
        per model and status. A kind is either grouped or not, held or not. With ``hold``, the
        entry goes with the first message ``HOLD_S`` after the first held one, alone
        ``HELD_ALONE_S`` later, or with a ``flush``."""
        groups = (self._held_groups if hold else self._groups).setdefault(kind, {})
        held = groups.get(key)
        if held is None:
            held = groups[key] = ([], [])
            if not hold:
                self._send_soon()
            elif self._held is None:
                self._held = asyncio.get_running_loop().call_later(HOLD_S, self._ripen)
        held[0].append(entry)
        if values:
            held[1].extend(values)

    def _pass_done(self, waited: bool = False) -> None:
        """The end of the pass that added to this message: send it, or, while ``busy()``,
        once the next pass has read what came meanwhile."""
        if not waited and self._busy is not None and self._busy():
            asyncio.get_running_loop().call_soon(self._pass_done, True)
            return
        self._send(held=False)

    def _ripen(self) -> None:
        """Held entries have waited ``HOLD_S``: they go with the next message, or alone."""
        self._ripe = True
        self._held = asyncio.get_running_loop().call_later(HELD_ALONE_S, self.flush)

    def flush(self) -> None:
        """Send everything now, what is held too."""
        self._send(held=True)

    def _send(self, held: bool) -> None:
        """Send this message; what is held too with ``held`` or once ripe."""
        self._due = False
        parts, values, groups = self._parts, self._values, self._groups
        self._parts, self._values, self._groups = {}, {}, {}
        if held or self._ripe:
            if self._held is not None:
                self._held.cancel()
                self._held = None
            self._ripe = False
            groups.update(self._held_groups)
            self._held_groups = {}
        if not (parts or groups) or self._transport.is_closing():
            return
        message: dict[str, Any] = dict(parts)
        for kind, flat in values.items():
            message[kind + "_values"] = pack(flat)
        for kind, keyed in groups.items():
            message[kind] = [(*key, entries) for key, (entries, _) in keyed.items()]
            if any(group_values for _, group_values in keyed.values()):
                message[kind + GROUPED] = [pack(v) for _, v in keyed.values()]
        self._write(encode(message))

    def _write(self, parts: list[Any]) -> None:
        """One message's buffers to the socket (uvloop: one ``writev``; bench/switch.py can
        have it let the GIL go meanwhile, an A/B on a GPU box)."""
        self._transport.writelines(parts)
