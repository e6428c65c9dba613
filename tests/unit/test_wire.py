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


class Writer:
    """An outbox's stream writer: what it was asked to write, a write at a time."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.chunks.append(data)

    def is_closing(self) -> bool:
        return False


def test_an_outbox_sends_one_message_per_pass_with_its_values_packed_and_grouped() -> None:
    async def run() -> list[bytes]:
        writer = Writer()
        outbox = wire.Outbox(writer)  # type: ignore[arg-type]
        outbox.add("results", ("r1", 2), [np.zeros(2), np.ones(2)])
        outbox.add_all("results", [("r2", 1), ("r3", 1)], [np.full(2, 2.0), np.full(2, 3.0)])
        outbox.add_all("results", [], [])  # nothing: no entry
        outbox.add("cancel", 7)
        outbox.group("requests", ("a", 1), 1, [np.full(3, 1.0)])
        outbox.group("requests", ("b", 1), 2, [np.full(3, 2.0), np.full(3, 3.0)])
        outbox.group("requests", ("a", 1), 3, [np.full(3, 4.0)])
        for key, seconds in ((("m", 200), 0.1), (("m", 504), 0.2), (("m", 200), 0.3)):
            outbox.group("answered", key, seconds)
        await asyncio.sleep(0)
        outbox.group("answered", ("m", 200), 0.4)  # the next message's
        await asyncio.sleep(0)
        return writer.chunks

    chunk, after = asyncio.run(run())
    message = roundtrip_bytes(chunk)
    assert message["results"] == [("r1", 2), ("r2", 1), ("r3", 1)] and message["cancel"] == [7]
    assert [v.tolist() for v in wire.values_of(message, "results")] == [
        [0.0, 0.0], [1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    assert message["requests"] == [("a", 1, [1, 3]), ("b", 1, [2])]
    groups = wire.grouped_values(message, "requests", stacked=True)
    assert [g.tolist() for g in groups] == [[[1.0] * 3, [4.0] * 3], [[2.0] * 3, [3.0] * 3]]
    assert message["answered"] == [("m", 200, [0.1, 0.3]), ("m", 504, [0.2])]
    assert wire.grouped_values(message, "answered") == [[], []]  # groups without values
    assert roundtrip_bytes(after) == {"answered": [("m", 200, [0.4])]}
    assert wire.values_of(message, "cancel") == []


def test_blocks_of_rows_travel_joined_and_come_back_as_blocks() -> None:
    blocks = [np.arange(6, dtype=np.float32).reshape(3, 2), np.full((1, 2), 9.0, np.float32)]
    packed = wire.pack(blocks)
    assert packed[0] == "joined"
    got = wire.unpack(roundtrip({"v": packed})["v"])
    assert [b.tolist() for b in got] == [b.tolist() for b in blocks]


def roundtrip_bytes(data: bytes) -> dict:
    async def run() -> dict:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        return await wire.read(reader)  # type: ignore[no-any-return]

    return asyncio.run(run())


def test_held_entries_go_with_the_next_message_or_after_the_hold() -> None:
    async def run() -> list[list[bytes]]:
        writer = Writer()
        outbox = wire.Outbox(writer)  # type: ignore[arg-type]
        outbox.group("answered", ("m", 200), 0.1, hold=True)
        await asyncio.sleep(0)
        alone = list(writer.chunks)  # nothing sent for a held entry alone
        outbox.add("cancel", 3)
        await asyncio.sleep(0)
        along = list(writer.chunks)  # it goes with the next message
        outbox.group("answered", ("m", 200), 0.2, hold=True)
        await asyncio.sleep(0)
        held = list(writer.chunks)  # alone again: held
        await asyncio.sleep(4 * wire.HOLD_S)
        return [alone, along, held, list(writer.chunks)]

    alone, along, held, late = asyncio.run(run())
    assert alone == [] and len(along) == 1
    assert roundtrip_bytes(along[0]) == {"cancel": [3], "answered": [("m", 200, [0.1])]}
    assert held == along and len(late) == 2
    assert roundtrip_bytes(late[1]) == {"answered": [("m", 200, [0.2])]}


def test_while_busy_a_message_waits_one_pass_for_the_next_passs_entries() -> None:
    async def run(busy: bool) -> list[bytes]:
        writer = Writer()
        outbox = wire.Outbox(writer, busy=lambda: busy)  # type: ignore[arg-type]
        outbox.add("cancel", 1)
        await asyncio.sleep(0)  # the next pass: what it adds goes with what waits
        outbox.add("cancel", 2)
        for _ in range(4):
            await asyncio.sleep(0)
        return writer.chunks

    assert [roundtrip_bytes(c) for c in asyncio.run(run(True))] == [{"cancel": [1, 2]}]
    assert [roundtrip_bytes(c) for c in asyncio.run(run(False))] == [
        {"cancel": [1]}, {"cancel": [2]}]
