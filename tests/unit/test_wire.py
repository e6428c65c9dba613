"""Messages between front ends and the device process: arrays travel packed and arrive whole."""

from __future__ import annotations

import numpy as np
import pytest

from app import wire


def roundtrip(message: dict) -> dict:
    return decoded(wire.encode(message))


def decoded(parts: list) -> dict:
    """The message that ``parts`` (``encode``'s buffers) hold, as the reading end decodes it."""
    data = b"".join(parts)
    length, head_length, count = wire.PREFIX.unpack_from(data)
    assert len(data) == wire.PREFIX.size + length
    return wire.decode(bytearray(data[wire.PREFIX.size:]), head_length, count)  # type: ignore[no-any-return]


@pytest.mark.parametrize("values", [
    [np.arange(4, dtype=np.float32) + i for i in range(3)],  # one shape: stacked
    [np.arange(n, dtype=np.int64) for n in (3, 1, 5)],  # token ids: joined
    [{"a": np.ones(2)}, [np.zeros(1)], "text"],  # anything else: as it is
    [np.ones(2, dtype=np.float32), np.ones(2, dtype=np.float64)],  # mixed dtypes
    [np.arange(12, dtype=np.float32).reshape(3, 4)[:, 1]],  # one strided view
    [np.arange(6, dtype=np.int32).reshape(2, 3)] * 2,  # 2-D
    [np.ones(2), "x"],  # an array, then not one
    [np.ones((2, 2)), np.ones(4)],  # ranks that differ: neither stacked nor joined
    [np.zeros(0, dtype=np.float32)] * 2,  # empty rows
])
def test_values_come_back_equal_in_order(values: list) -> None:
    got = wire.unpack(roundtrip({"v": wire.pack(values)})["v"])
    assert len(got) == len(values)
    for a, b in zip(got, values, strict=True):
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        else:
            assert repr(a) == repr(b)


def test_packing_joins_arrays_and_they_arrive_writable() -> None:
    rows = [np.full(3, i, dtype=np.float32) for i in range(64)]
    assert wire.pack(rows)[0] == "stacked"
    assert wire.pack([np.arange(n) for n in (1, 2)])[0] == "joined"
    assert wire.pack([np.float32(1.0)])[0] == "list"  # a numpy scalar is not an array
    got = wire.unpack(roundtrip({"v": wire.pack(rows)})["v"])
    assert got[5].flags.writeable and got[5].tolist() == [5.0] * 3


def test_blocks_of_rows_travel_joined_and_come_back_as_blocks() -> None:
    blocks = [np.arange(6, dtype=np.float32).reshape(3, 2), np.full((1, 2), 9.0, np.float32)]
    packed = wire.pack(blocks)
    assert packed[0] == "joined"
    got = wire.unpack(roundtrip({"v": packed})["v"])
    assert [b.tolist() for b in got] == [b.tolist() for b in blocks]
