"""Messages between front ends and the device process: arrays travel packed and arrive whole."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from app import wire


def roundtrip(message: dict) -> dict:
    return roundtrip_bytes(wire.encode(message))


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


def test_an_outbox_sends_one_message_per_pass_with_its_values_packed_and_tallied() -> None:
    class Writer:
        def __init__(self) -> None:
            self.chunks: list[bytes] = []

        def write(self, data: bytes) -> None:
            self.chunks.append(data)

        def is_closing(self) -> bool:
            return False

    async def run() -> list[bytes]:
        writer = Writer()
        outbox = wire.Outbox(writer)  # type: ignore[arg-type]
        outbox.add("requests", ("r1", 2), [np.zeros(2), np.ones(2)])
        outbox.add_all("requests", [("r2", 1), ("r3", 1)], [np.full(2, 2.0), np.full(2, 3.0)])
        outbox.add_all("requests", [], [])  # nothing: no entry
        outbox.add("cancel", 7)
        for key, seconds in ((("m", 200), 0.1), (("m", 504), 0.2), (("m", 200), 0.3)):
            outbox.tally("answered", key, seconds)
        await asyncio.sleep(0)
        outbox.tally("answered", ("m", 200), 0.4)  # the next message's
        await asyncio.sleep(0)
        return writer.chunks

    chunk, after = asyncio.run(run())
    message = roundtrip_bytes(chunk)
    assert message["requests"] == [("r1", 2), ("r2", 1), ("r3", 1)] and message["cancel"] == [7]
    assert message["answered"] == [("m", 200, [0.1, 0.3]), ("m", 504, [0.2])]
    assert roundtrip_bytes(after) == {"answered": [("m", 200, [0.4])]}
    assert [v.tolist() for v in wire.values_of(message, "requests")] == [
        [0.0, 0.0], [1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    assert wire.values_of(message, "cancel") == []


def roundtrip_bytes(data: bytes) -> dict:
    async def run() -> dict:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        return await wire.read(reader)  # type: ignore[no-any-return]

    return asyncio.run(run())
