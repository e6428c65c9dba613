"""The ends of a link: an outbox sends a pass's entries as one message, an inbox reads every
message whole, however its bytes arrive."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import numpy as np
import pytest
import uvloop

from app import links, wire
from bench.switch import gil_free_write
from tests.unit.test_wire import decoded


class Writer:
    """An outbox's transport: what it was asked to write, a message at a time."""

    def __init__(self) -> None:
        self.chunks: list[list[Any]] = []

    def writelines(self, parts: list[Any]) -> None:
        self.chunks.append(parts)

    def is_closing(self) -> bool:
        return False


def test_an_outbox_sends_one_message_per_pass_with_its_values_packed_and_grouped() -> None:
    async def run() -> list[list[Any]]:
        writer = Writer()
        outbox = links.Outbox(writer)  # type: ignore[arg-type]
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
    message = decoded(chunk)
    assert message["results"] == [("r1", 2), ("r2", 1), ("r3", 1)] and message["cancel"] == [7]
    assert [v.tolist() for v in wire.values_of(message, "results")] == [
        [0.0, 0.0], [1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    assert message["requests"] == [("a", 1, [1, 3]), ("b", 1, [2])]
    groups = wire.grouped_values(message, "requests", stacked=True)
    assert [g.tolist() for g in groups] == [[[1.0] * 3, [4.0] * 3], [[2.0] * 3, [3.0] * 3]]
    assert message["answered"] == [("m", 200, [0.1, 0.3]), ("m", 504, [0.2])]
    assert wire.grouped_values(message, "answered") == [[], []]  # groups without values
    assert decoded(after) == {"answered": [("m", 200, [0.4])]}
    assert wire.values_of(message, "cancel") == []


@pytest.mark.parametrize("hold_s, alone_s", [(3600.0, 3600.0), (0.01, 3600.0), (0.01, 0.01)])
def test_held_entries_go_with_a_message_after_the_hold_alone_later_or_with_a_flush(
        monkeypatch: pytest.MonkeyPatch, hold_s: float, alone_s: float) -> None:
    monkeypatch.setattr(links, "HOLD_S", hold_s)
    monkeypatch.setattr(links, "HELD_ALONE_S", alone_s)

    async def run() -> list[dict[str, Any]]:
        writer = Writer()
        outbox = links.Outbox(writer)  # type: ignore[arg-type]
        outbox.group("answered", ("m", 200), 0.1, hold=True)
        outbox.group("answered", ("m", 200), 0.2, hold=True)
        await asyncio.sleep(0)
        assert writer.chunks == []  # nothing sent for held entries alone
        if hold_s < 1:  # past the hold
            await asyncio.sleep(4 * (hold_s + min(alone_s, 1.0)))
        outbox.add("cancel", 3)
        await asyncio.sleep(0)
        outbox.group("answered", ("m", 504), 0.3, hold=True)
        outbox.add("acked", 1)
        outbox.flush()  # at once, with what is held
        return [decoded(chunk) for chunk in writer.chunks]

    sent = asyncio.run(run())
    counts = {"answered": [("m", 200, [0.1, 0.2])]}
    if hold_s > 1:  # the message goes without them, a flush with them
        assert sent == [{"cancel": [3]},
                        {"acked": [1], "answered": [("m", 200, [0.1, 0.2]), ("m", 504, [0.3])]}]
    elif alone_s > 1:  # held past the hold: with the next message
        assert sent == [{"cancel": [3], **counts}, {"acked": [1], "answered": [("m", 504, [0.3])]}]
    else:  # no message to go with: alone
        assert sent == [counts, {"cancel": [3]}, {"acked": [1], "answered": [("m", 504, [0.3])]}]


def test_while_busy_a_message_waits_one_pass_for_the_next_passs_entries() -> None:
    async def run(busy: bool) -> list[list[Any]]:
        writer = Writer()
        outbox = links.Outbox(writer, busy=lambda: busy)  # type: ignore[arg-type]
        outbox.add("cancel", 1)
        await asyncio.sleep(0)  # the next pass: what it adds goes with what waits
        outbox.add("cancel", 2)
        for _ in range(4):
            await asyncio.sleep(0)
        return writer.chunks

    assert [decoded(c) for c in asyncio.run(run(True))] == [{"cancel": [1, 2]}]
    assert [decoded(c) for c in asyncio.run(run(False))] == [
        {"cancel": [1]}, {"cancel": [2]}]


class Transport:
    """An inbox's transport: whether it was asked to stop reading."""

    def __init__(self) -> None:
        self.paused = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def inbox() -> links.Inbox:
    box = links.Inbox()
    box.connection_made(Transport())  # type: ignore[arg-type]
    return box


def feed(box: links.Inbox, data: bytes, step: int) -> None:
    """``data`` into ``box`` as the loop would put it, at most ``step`` bytes a read."""
    at = 0
    while at < len(data):
        buffer = box.get_buffer(-1)
        assert len(buffer) > 0
        n = min(len(buffer), step, len(data) - at)
        buffer[:n] = data[at:at + n]
        box.buffer_updated(n)
        at += n


async def read_all(box: links.Inbox, n: int) -> list[Any]:
    return [await box.read() for _ in range(n)]


# Short messages, one just under the scratch buffer, and a long one that is read into its own.
LONG = np.arange(links.SCRATCH_BYTES // 2, dtype=np.float32)  # twice the scratch buffer
MESSAGES = [
    {"cancel": [1]},
    {"results": [("r", None, 1)], "results_values": wire.pack([np.ones(3, dtype=np.float32)])},
    {"v": wire.pack([np.zeros(links.SCRATCH_BYTES // 4 - 64, dtype=np.float32)])},
    {"v": wire.pack([LONG])},
    {"cancel": [2, 3]},
]


def same(a: Any, b: Any) -> bool:
    if isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in b)
    if isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(b, np.ndarray):
        return a.flags.writeable and a.dtype == b.dtype and np.array_equal(a, b)
    return bool(a == b)


@pytest.mark.parametrize("step", [1, 7, 4096, 100_000, 10**9])
def test_an_inbox_reads_each_message_whole_however_its_bytes_arrive(step: int) -> None:
    data = b"".join(b"".join(wire.encode(m)) for m in MESSAGES)
    count = len(MESSAGES)
    if step == 1:  # a byte a read, over the first two messages (the rest would take long)
        count = 2
        data = data[:sum(len(b"".join(wire.encode(m))) for m in MESSAGES[:count])]
    box = inbox()
    feed(box, data, step)
    got = asyncio.run(read_all(box, count))
    assert all(same(a, b) for a, b in zip(got, MESSAGES[:count], strict=True))


def test_an_inbox_stops_reading_while_it_holds_many_messages_and_reads_again_at_half() -> None:
    box = inbox()
    one = b"".join(wire.encode({"cancel": [1]}))
    feed(box, one * (links.HELD_MESSAGES - 1), 10**9)
    assert box.transport is not None and not box.transport.paused  # type: ignore[attr-defined]
    feed(box, one, 10**9)
    assert box.transport.paused  # type: ignore[attr-defined]
    asyncio.run(read_all(box, links.HELD_MESSAGES // 2 - 1))
    assert box.transport.paused  # type: ignore[attr-defined]
    asyncio.run(read_all(box, 1))
    assert not box.transport.paused  # type: ignore[attr-defined]


def test_an_inbox_gives_what_it_holds_then_says_the_link_is_closed() -> None:
    box = inbox()
    feed(box, b"".join(wire.encode({"cancel": [1]})) + b"\x00\x00", 10**9)  # and a partial one
    box.connection_lost(None)

    async def run() -> Any:
        first = await box.read()
        with pytest.raises(ConnectionError):
            await box.read()
        return first

    assert asyncio.run(run()) == {"cancel": [1]}


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_two_ends_of_a_socket_exchange_long_and_short_messages(loop: str) -> None:
    async def run() -> list[Any]:
        a, b = socket.socketpair()
        (inbox_a, transport_a), (inbox_b, transport_b) = await links.connect(a), \
            await links.connect(b)
        waiting = asyncio.ensure_future(read_all(inbox_b, len(MESSAGES)))
        for message in MESSAGES:
            transport_a.writelines(wire.encode(message))
        got = await asyncio.wait_for(waiting, 10)
        transport_b.writelines(wire.encode({"cancel": [9]}))
        got.append(await asyncio.wait_for(inbox_a.read(), 10))
        transport_a.close()
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(inbox_b.read(), 10)
        transport_b.close()
        return got

    got = uvloop.run(run()) if loop == "uvloop" else asyncio.run(run())
    assert all(same(a, b) for a, b in zip(got, [*MESSAGES, {"cancel": [9]}], strict=True))


@pytest.mark.parametrize("gil_free", [False, True], ids=["writelines", "gil-free"])
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_an_outboxs_messages_arrive_whole_and_in_order_when_the_socket_takes_part(
        loop: str, gil_free: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a send buffer far smaller than the long messages, the socket takes part of one,
    the transport holds the rest, and the messages after it wait behind that rest, so the peer
    reads every one whole and in order; so too where bench/switch.py writes each message
    straight to the socket first, the GIL let go (``gil_free_write``)."""
    if gil_free:
        monkeypatch.setattr(links.Outbox, "_write", gil_free_write)
    sent: list[tuple[str, Any, list[Any]]] = [
        ("cancel", 1, []), ("v", "long", [LONG]), ("cancel", 2, []), ("v", "twice", [LONG * 2]),
        ("cancel", 3, [])]

    async def run() -> tuple[list[Any], list[int]]:
        a, b = socket.socketpair()
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        (_, transport_a), (inbox_b, _) = await links.connect(a), await links.connect(b)
        outbox, held = links.Outbox(transport_a), []
        waiting = asyncio.ensure_future(read_all(inbox_b, len(sent)))
        for kind, entry, values in sent:  # a message a pass of the loop
            outbox.add(kind, entry, values)
            await asyncio.sleep(0)
            held.append(transport_a.get_write_buffer_size())
        got = await asyncio.wait_for(waiting, 10)
        transport_a.close()
        return got, held

    got, held = uvloop.run(run()) if loop == "uvloop" else asyncio.run(run())
    assert max(held) > 0  # the socket did not take all of some message at once
    assert [m[kind] for m, (kind, _, _) in zip(got, sent, strict=True)] == [
        [entry] for _, entry, _ in sent]
    assert all(same(wire.values_of(m, kind), values)
               for m, (kind, _, values) in zip(got, sent, strict=True))


@pytest.mark.parametrize("gil_free", [False, True], ids=["writelines", "gil-free"])
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_an_outbox_to_a_closed_peer_lets_its_transport_report_the_loss(
        loop: str, gil_free: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if gil_free:
        monkeypatch.setattr(links.Outbox, "_write", gil_free_write)

    async def run() -> bool:
        a, b = socket.socketpair()
        inbox_a, transport_a = await links.connect(a)
        b.close()
        outbox = links.Outbox(transport_a)
        outbox.add("cancel", 1)
        await asyncio.sleep(0)  # the pass ends: the write fails
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(inbox_a.read(), 10)
        return transport_a.is_closing()

    assert (uvloop.run(run()) if loop == "uvloop" else asyncio.run(run())) is True
