"""Messages between front ends and the device process (docs/frontends.md).

A message is one pickle whose numpy arrays travel as protocol-5 out-of-band frames, so the bytes
of a request's tensors are copied once into the socket and never pickled element by element.
On the wire: total length, header length and frame count, then each frame's length, the pickle,
the frames. Frames are read into a writable buffer, so arrays arrive writable.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from typing import Any

_PREFIX = struct.Struct("!III")  # bytes after the prefix, pickle length, frame count


def encode(message: Any) -> bytes:
    """``message`` as one write's bytes."""
    frames: list[pickle.PickleBuffer] = []
    head = pickle.dumps(message, protocol=5, buffer_callback=frames.append)
    views = [frame.raw() for frame in frames]
    sizes = struct.pack(f"!{len(views)}I", *(v.nbytes for v in views))
    body = b"".join([sizes, head, *views])
    return _PREFIX.pack(len(body), len(head), len(views)) + body


async def read(reader: asyncio.StreamReader) -> Any:
    """The next message; IncompleteReadError once the peer has gone."""
    length, head_length, count = _PREFIX.unpack(await reader.readexactly(_PREFIX.size))
    view = memoryview(bytearray(await reader.readexactly(length)))
    sizes = struct.unpack_from(f"!{count}I", view)
    at = 4 * count
    head = view[at:at + head_length]
    at += head_length
    frames = []
    for size in sizes:
        frames.append(view[at:at + size])
        at += size
    return pickle.loads(head, buffers=frames)


class Outbox:
    """Collects what one pass of the event loop has to say to the peer and sends it as one
    message when the pass is done: many requests (or results) travel in one write."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._parts: dict[str, list[Any]] = {}
        self._due = False

    def add(self, kind: str, entry: Any) -> None:
        self._parts.setdefault(kind, []).append(entry)
        if not self._due:
            self._due = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._due = False
        if not self._parts or self._writer.is_closing():
            self._parts = {}
            return
        parts, self._parts = self._parts, {}
        self._writer.write(encode(parts))
