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

Each end of a link reads and writes its socket with app/links.py's ``Inbox`` and ``Outbox``.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any

import numpy as np

from app.arrays import listed_rows, stack_alike

PREFIX = struct.Struct("!III")  # bytes after the prefix, pickle length, frame count
_STACKED, _JOINED = "stacked", "joined"  # how ``pack`` holds a list of arrays
_RAW = "raw"  # a packed entry whose array travels as (frame, dtype, shape): ``encode``, ``decode``
GROUPED = "_grouped_values"  # a grouped kind's values: one packed entry per group


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
        return packed[1] if stacked else listed_rows(packed[1])
    if kind == _JOINED:  # slices, not np.split: a fifth of its time for 32 token arrays
        flat, parts, at = packed[1], [], 0
        for n in packed[2]:
            parts.append(flat[at:at + n])
            at += n
        return parts
    return list(packed[1])


def encode(message: Any) -> list[Any]:
    """``message`` as the buffers of one ``writelines``: header, pickle, frames."""
    frames: list[Any] = []
    if isinstance(message, dict):
        message = {key: [_raw(v, frames) for v in value] if key.endswith(GROUPED)
                   else _raw(value, frames) for key, value in message.items()}
    head = pickle.dumps(message, protocol=5,
                        buffer_callback=lambda b: frames.append(b.raw()))
    sizes = struct.pack(f"!{len(frames)}I", *(f.nbytes for f in frames))
    length = len(sizes) + len(head) + sum(f.nbytes for f in frames)
    return [PREFIX.pack(length, len(head), len(frames)) + sizes, head, *frames]


def _raw(value: Any, frames: list[Any]) -> Any:
    """A packed entry's array as a frame and a reference to it; anything else as it is."""
    if type(value) is tuple and value and value[0] in (_STACKED, _JOINED):
        array = np.ascontiguousarray(value[1])
        frames.append(array.data.cast("B") if array.size else memoryview(b""))  # 0 in shape
        return (_RAW, value[0], len(frames) - 1, array.dtype.str, array.shape, *value[2:])
    return value


def decode(body: bytearray, head_length: int, count: int) -> Any:
    """The message whose bytes after the prefix are ``body``; its arrays are views of it."""
    view = memoryview(body)
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
            if key.endswith(GROUPED):
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


def values_of(message: dict[str, Any], kind: str, stacked: bool = False) -> Any:
    """The values the entries of ``kind`` carry, in their order (``stacked``: see ``unpack``)."""
    packed = message.get(kind + "_values")
    return unpack(packed, stacked) if packed is not None else []


def grouped_values(message: dict[str, Any], kind: str, stacked: bool = False) -> list[Any]:
    """Each group of ``kind``'s values (``Outbox.group``), in the groups' order; none: []."""
    packed = message.get(kind + GROUPED)
    if packed is None:
        return [[] for _ in message.get(kind, ())]
    return [unpack(p, stacked) for p in packed]
