"""Messages between front ends and the device process (docs/frontends.md).

A message is one pickle whose numpy arrays travel as protocol-5 out-of-band frames, so the bytes
of a request's tensors are copied once into the socket and never pickled element by element.
On the wire: total length, header length and frame count, then each frame's length, the pickle,
the frames. Frames are read into a writable buffer, so arrays arrive writable.

The items (or results) of all the requests in one message travel together (``pack``): arrays
of one dtype and shape as one stacked array, arrays of one dtype whose rows are alike (token
ids, blocks of rows) as one concatenated array and their lengths. Pickling an array costs about
as much as pickling a hundred of them stacked, so a message of 64 small requests costs a fifth
of what it would. A packed array travels as its bytes in a frame and its dtype and shape in the
pickle, not as a pickled ndarray: that costs a few microseconds where ndarray's own pickling
costs ten, which is most of a one-request message's encoding.

Entries may also travel grouped (``Outbox.group``): one entry per key and message, holding the
entries added under that key in their order, with their values packed per group. A front end's
requests travel so, one group per model version and priority level: the device process admits
each group as it comes, without sorting requests one by one (app/bridge.py).
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from app.arrays import stack_alike

# A link's stream buffer (``asyncio.open_connection(limit=...)``). asyncio's 64 KiB default
# pauses and resumes the socket every 128 KiB, which for messages of large tensors (32 rows of
# 512 floats are 64 KiB a request) doubled the device process's CPU a request (bench.ipc).
STREAM_LIMIT = 16 * 2**20
_PREFIX = struct.Struct("!III")  # bytes after the prefix, pickle length, frame count
_STACKED, _JOINED = "stacked", "joined"  # how ``pack`` holds a list of arrays
_RAW = "raw"  # a packed entry whose array travels as (frame, dtype, shape): ``encode``, ``read``
_GROUPED = "_grouped_values"  # a grouped kind's values: one packed entry per group
# The longest an entry added with ``hold`` waits for a message to go with (a front end's
# request counts: a scrape of /metrics asks for them at once, app/bridge.py). Short, since a
# front end killed with SIGKILL loses what it holds; a message of their own 20 times a second
# costs the device process nothing that matters.
HOLD_S = 0.05


def pack(values: list[Any]) -> tuple[Any, ...]:
    """``values`` in the form that pickles fastest; ``unpack`` gives them back, as views."""
    first = values[0] if values else None
    if type(first) is np.ndarray and first.ndim and not first.dtype.hasobject:
        dtype, shape = first.dtype, first.shape
        # One pass over the values each way: a chunk's rows make this per-row work.
        if all(type(v) is np.ndarray and v.shape == shape and v.dtype == dtype for v in values):
            return (_STACKED, first[None] if len(values) == 1 else stack_alike(values))
        rest = shape[1:]  # joined along the first axis: token ids, blocks of rows
        if all(type(v) is np.ndarray and v.shape[1:] == rest and v.dtype == dtype
               for v in values):
            return (_JOINED, np.concatenate(values), [len(v) for v in values])
    return ("list", values)


def unpack(packed: tuple[Any, ...], stacked: bool = False) -> Any:
    """The values as a list; with ``stacked``, values that travel stacked as that one array
    (its rows are the values: slicing it gives arrays, not lists)."""
    kind = packed[0]
    if kind == _STACKED:
        return packed[1] if stacked else list(packed[1])
    if kind == _JOINED:  # slices, not np.split: a fifth of its time for 32 token arrays
        flat, parts, at = packed[1], [], 0
        for n in packed[2]:
            parts.append(flat[at:at + n])
            at += n
        return parts
    return list(packed[1])


def encode(message: Any) -> bytes:
    """``message`` as one write's bytes."""
    frames: list[Any] = []
    if isinstance(message, dict):
        message = {key: [_raw(v, frames) for v in value] if key.endswith(_GROUPED)
                   else _raw(value, frames) for key, value in message.items()}
    head = pickle.dumps(message, protocol=5,
                        buffer_callback=lambda b: frames.append(b.raw()))
    sizes = struct.pack(f"!{len(frames)}I", *(f.nbytes for f in frames))
    body = b"".join([sizes, head, *frames])
    return _PREFIX.pack(len(body), len(head), len(frames)) + body


def _raw(value: Any, frames: list[Any]) -> Any:
    """A packed entry's array as a frame and a reference to it; anything else as it is."""
    if type(value) is tuple and value and value[0] in (_STACKED, _JOINED):
        array = np.ascontiguousarray(value[1])
        frames.append(array.data.cast("B") if array.size else memoryview(b""))  # 0 in shape
        return (_RAW, value[0], len(frames) - 1, array.dtype.str, array.shape, *value[2:])
    return value


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
    message = pickle.loads(head, buffers=frames)
    if isinstance(message, dict):
        for key, value in message.items():
            if key.endswith(_GROUPED):
                message[key] = [_cooked(v, frames) for v in value]
            else:
                message[key] = _cooked(value, frames)
    return message


def _cooked(value: Any, frames: list[memoryview]) -> Any:
    """``_raw``'s reference to a frame as the packed entry it was; anything else as it is."""
    if type(value) is tuple and value and value[0] == _RAW:
        _, kind, index, dtype, shape, *rest = value
        return (kind, np.frombuffer(frames[index], dtype).reshape(shape), *rest)
    return value


class Outbox:
    """Collects what one pass of the event loop has to say to the peer and sends it as one
    message when the pass is done: many requests (or results) travel in one write. An entry
    may carry values (a request's items, its results): those of every entry of a kind travel
    packed together, under ``KIND_values``, in the entries' order."""

    def __init__(self, writer: asyncio.StreamWriter,
                 busy: Callable[[], bool] | None = None) -> None:
        self._writer = writer
        # While ``busy()`` says so, a message waits one more pass of the event loop: the
        # requests that pass reads go with it, in one message for the device process.
        self._busy = busy
        self._parts: dict[str, list[Any]] = {}
        self._values: dict[str, list[Any]] = {}
        self._groups: dict[str, dict[tuple[Any, ...], tuple[list[Any], list[Any]]]] = {}
        self._due = False
        self._held: asyncio.TimerHandle | None = None  # ``group(hold=True)``'s timer

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
        per model and status. A kind is either grouped or not. With ``hold``, the entry sends
        no message of its own: it goes with the next one, or after ``HOLD_S``."""
        groups = self._groups.setdefault(kind, {})
        held = groups.get(key)
        if held is None:
            held = groups[key] = ([], [])
            if not hold:
                self._send_soon()
            elif self._held is None and not self._due:
                self._held = asyncio.get_running_loop().call_later(HOLD_S, self.flush)
        held[0].append(entry)
        if values:
            held[1].extend(values)

    def _pass_done(self, waited: bool = False) -> None:
        """The end of the pass that added to this message: send it, or, while ``busy()``,
        once the next pass has read what came meanwhile."""
        if not waited and self._busy is not None and self._busy():
            asyncio.get_running_loop().call_soon(self._pass_done, True)
            return
        self.flush()

    def flush(self) -> None:
        self._due = False
        if self._held is not None:
            self._held.cancel()
            self._held = None
        parts, values, groups = self._parts, self._values, self._groups
        self._parts, self._values, self._groups = {}, {}, {}
        if not (parts or groups) or self._writer.is_closing():
            return
        message: dict[str, Any] = dict(parts)
        for kind, flat in values.items():
            message[kind + "_values"] = pack(flat)
        for kind, held in groups.items():
            message[kind] = [(*key, entries) for key, (entries, _) in held.items()]
            if any(group_values for _, group_values in held.values()):
                message[kind + _GROUPED] = [pack(v) for _, v in held.values()]
        self._writer.write(encode(message))


def values_of(message: dict[str, Any], kind: str, stacked: bool = False) -> Any:
    """The values the entries of ``kind`` carry, in their order (``stacked``: see ``unpack``)."""
    packed = message.get(kind + "_values")
    return unpack(packed, stacked) if packed is not None else []


def grouped_values(message: dict[str, Any], kind: str, stacked: bool = False) -> list[Any]:
    """Each group of ``kind``'s values (``Outbox.group``), in the groups' order; none: []."""
    packed = message.get(kind + _GROUPED)
    if packed is None:
        return [[] for _ in message.get(kind, ())]
    return [unpack(p, stacked) for p in packed]
