"""The device process's end of a front end's link (app/bridge.py), driven with the messages a
front end sends: one message's requests are admitted in order against the one queue, each is
answered once (results or its refusal), a cancelled one never, and counts are counted once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest
import torch

from app.asks import Asked, Replied
from app.bridge import SNAPSHOT_CHECK_S, Bridge
from app.device_link import FrontEndLink
from app.models.base import Tensors
from app.models.tensor import TensorHandler
from app.runtime import InferenceService
from tests.conftest import sample, wait_until
from tests.fakes import EchoHandler, FailingHandler, GatedHandler
from tests.unit.test_runtime import call, running

pytestmark = pytest.mark.asyncio


class Outbox:
    """What the bridge sends to the front end, entry by entry."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any, list[Any] | None]] = []

    def add(self, kind: str, entry: Any, values: list[Any] | None = None) -> None:
        self.sent.append((kind, entry, values))

    def add_all(self, kind: str, entries: list[Any], values: list[Any]) -> None:
        at = 0
        for entry in entries:
            self.add(kind, entry, values[at:at + entry[2]])
            at += entry[2]

    def results(self) -> dict[int, Any]:
        """Each request's answer: its results, or its error's (status, type)."""
        answers = {}
        for kind, entry, values in self.sent:
            if kind == "results":
                answers[entry[0]] = values if entry[1] is None else entry[1][:2]
            elif kind == "block":  # a request's rows computed together
                assert values is not None
                answers[entry], = values
            elif kind == "rows":  # one-row requests' rows, one block
                assert values is not None
                block, = values
                answers.update((rid, [row]) for rid, row in zip(entry, block, strict=True))
        return answers


def link() -> tuple[FrontEndLink, Outbox]:
    outbox = Outbox()
    return FrontEndLink(outbox), outbox  # type: ignore[arg-type]


def message(service: InferenceService, *requests: tuple[int, list[Any]],
            name: str | None = None, stacked: bool = False) -> dict[str, Any]:
    """``requests`` (id, items) as a front end sends them, at the default level: one entry
    each, their items in one list."""
    deadline = time.monotonic() + 30.0
    entries = [(rid, deadline, f"log-{rid}", len(items)) for rid, items in requests]
    values = [x for _, items in requests for x in items]
    # As a front end packs rows of one shape (app/wire.py), or not.
    packed = ("stacked", np.stack(values)) if stacked else ("list", values)
    return grouped(service, entries, packed, name)


def grouped(service: InferenceService, entries: list[tuple[Any, ...]], packed: tuple[Any, ...],
            name: str | None = None) -> dict[str, Any]:
    """A message of one group of requests, (id, deadline, log id, items) each, for the default
    model's version at its default level (``Outbox.group``)."""
    model = service.repository.get()
    group = (name or model.name, model.version, model.settings.default_level, entries)
    return {"requests": [group], "requests_grouped_values": [packed]}


class GatedRows(TensorHandler):
    """Rows of two numbers, doubled; rows stack, so a front end's stacked request is one chunk.
    Once ``armed`` (after the warm-up): ``shapes`` says what each batch's items were (a row,
    or a chunk of rows), and a batch waits for ``gate``."""

    def __init__(self, shape: tuple[int, ...] | None = (2,)) -> None:
        super().__init__("rows", lambda device: Double(), shape, examples=[[0.0, 0.0]])
        self.gate: threading.Event | Turnstile = threading.Event()
        self.entered = threading.Event()
        self.shapes: list[list[tuple[int, ...]]] = []
        self.armed = False

    def collate(self, items: list[Any]) -> Tensors:
        if not self.armed:
            return super().collate(items)
        self.entered.set()
        assert self.gate.wait(timeout=60), "gate never opened"
        self.shapes.append([item.shape for item in items])
        return super().collate(items)


class Turnstile:
    """A gate that lets one model call through a ``set``."""

    def __init__(self) -> None:
        self._turns = threading.Semaphore(0)

    def set(self) -> None:
        self._turns.release()

    def wait(self, timeout: float) -> bool:
        return self._turns.acquire(timeout=timeout)


class Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * x


@asynccontextmanager
async def busy_rows(max_batch_size: int, busy_with: tuple[int, Any]) -> AsyncIterator[
        tuple[GatedRows, InferenceService, Bridge, FrontEndLink, Outbox]]:
    """A model of rows (``GatedRows``) whose device thread holds the batch of one request
    (``busy_with``: its id and row) at the gate; the front end's link to it."""
    handler = GatedRows()
    async with running(handler, max_batch_size=max_batch_size, queue_capacity=16,
                       max_instances=8) as service:
        bridge, (front, outbox) = Bridge(service), link()
        handler.armed = True
        rid, row = busy_with
        bridge._handle(front, message(service, (rid, [row]), stacked=True))
        await wait_until(handler.entered.is_set, "the device busy")
        yield handler, service, bridge, front, outbox


async def test_one_message_is_admitted_in_order_against_the_one_queue() -> None:
    """queue_capacity 4 with the device busy: of six requests in one message the first four
    are queued and the last two refused at once; every admitted one is answered."""
    handler = GatedHandler()
    async with running(handler, max_batch_size=1, queue_capacity=4, max_instances=4) as service:
        bridge, (front, outbox) = Bridge(service), link()
        bridge._handle(front, message(service, (0, [0.0])))
        await wait_until(handler.entered.is_set, "the device busy")
        bridge._handle(front, message(service, *[(i, [float(i)]) for i in range(1, 7)]))
        assert outbox.results() == {5: (503, "busy"), 6: (503, "busy")}
        assert service.repository.get().queue.depth == 4
        handler.gate.set()
        await wait_until(lambda: len(outbox.results()) == 7, "every request answered")
        answers = outbox.results()
        assert [answers[i] for i in range(5)] == [[2.0 * i] for i in range(5)]
        assert service.repository.get().in_flight == 0 and not front.waiting


async def test_a_request_of_many_items_is_admitted_or_refused_whole() -> None:
    handler = GatedHandler()
    async with running(handler, max_batch_size=1, queue_capacity=4, max_instances=4) as service:
        bridge, (front, outbox) = Bridge(service), link()
        bridge._handle(front, message(service, (0, [0.0])))
        await wait_until(handler.entered.is_set, "the device busy")
        bridge._handle(front, message(service, (1, [1.0, 2.0, 3.0]), (2, [4.0, 5.0]),
                                      (3, [6.0])))
        assert outbox.results() == {2: (503, "busy")}  # 3 + 2 > 4; 3 + 1 fits
        handler.gate.set()
        await wait_until(lambda: len(outbox.results()) == 4, "every request answered")
        assert outbox.results()[1] == [2.0, 4.0, 6.0] and outbox.results()[3] == [12.0]


async def test_a_cancelled_request_is_dropped_unanswered() -> None:
    handler = GatedHandler()
    async with running(handler, max_batch_size=1) as service:
        bridge, (front, outbox) = Bridge(service), link()
        bridge._handle(front, message(service, (0, [0.0])))
        bridge._handle(front, message(service, (1, [1.0])))  # not one chunk with the first
        await wait_until(handler.entered.is_set, "the device busy")
        bridge._handle(front, {"cancel": [1]})
        assert service.repository.get().in_flight == 1 and list(front.waiting) == [0]
        handler.gate.set()
        await wait_until(lambda: 0 in outbox.results(), "the other answered")
        await call(service, [9.0])  # a later batch: the cancelled item was dropped before it
        assert 1 not in outbox.results() and handler.seen == [0.0, 9.0]
        assert sample(service.metrics.registry, "batchserve_dropped_items_total",
                      reason="cancelled") == 1


async def test_an_unknown_model_is_refused_per_request_and_counts_arrive_once() -> None:
    async with running(EchoHandler()) as service:
        bridge, (front, outbox) = Bridge(service), link()
        bridge._handle(front, message(service, (1, [1.0]), (2, [2.0]), name="nope"))
        assert outbox.results() == {1: (404, "not_found"), 2: (404, "not_found")}
        model = service.repository.get()
        bridge._handle(front, {"answered": [(model.name, model.version, 200, "http",
                                             [0.001, 0.002]),
                                            (model.name, model.version, 504, "grpc", [0.5])]})
        registry = service.metrics.registry
        assert sample(registry, "batchserve_requests_total", status="200") == 2
        assert sample(registry, "batchserve_requests_total", status="504", protocol="grpc") == 1
        assert sample(registry, "batchserve_request_duration_seconds_count") == 3


async def test_a_failing_model_answers_each_request_500_once() -> None:
    async with running(FailingHandler(), max_batch_size=8) as service:  # raises on a negative
        bridge, (front, outbox) = Bridge(service), link()
        bridge._handle(front, message(service, (1, [-1.0]), (2, [2.0, -3.0])))
        await wait_until(lambda: len(outbox.results()) == 2, "both answered")
        assert outbox.results() == {1: (500, "model_error"), 2: (500, "model_error")}
        assert len([kind for kind, *_ in outbox.sent if kind == "results"]) == 2
        assert service.repository.get().in_flight == 0 and not front.waiting


class DoubleNonNegative(torch.nn.Module):
    """Doubles rows; raises on a batch that holds a negative number (an input it cannot take)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x < 0).any():
            raise ValueError("negative input")
        return 2 * x


async def test_a_row_the_model_fails_on_fails_that_request_alone() -> None:
    """Five one-row requests queued as one chunk, one of them a row the model raises on: that
    request gets 500, the other four their rows (the chunk tried apart, app/failures.py)."""
    handler = TensorHandler("rows", lambda device: DoubleNonNegative(), (2,),
                            examples=[[0.0, 0.0]])
    async with running(handler, max_batch_size=8) as service:
        bridge, (front, outbox) = Bridge(service), link()
        rows = np.arange(10, dtype=np.float32).reshape(5, 2)
        rows[3] = -1.0
        bridge._handle(front, message(service, *[(i, [rows[i]]) for i in range(5)],
                                      stacked=True))
        await wait_until(lambda: len(outbox.results()) == 5, "every request answered")
        answers = outbox.results()
        assert answers[3] == (500, "model_error")
        for i in (0, 1, 2, 4):
            np.testing.assert_array_equal(np.stack(answers[i]), 2 * rows[i:i + 1])
        assert service.repository.get().in_flight == 0 and not front.waiting


async def test_a_stacked_request_is_one_chunk_that_a_batch_limit_splits() -> None:
    """A request's rows that came stacked are queued as one item whatever their number, counted
    as rows; a batch takes what fits of it, the rest goes first into the next; every row's
    result comes back in order."""
    rows = np.arange(14, dtype=np.float32).reshape(7, 2)
    async with busy_rows(3, (0, rows[0])) as (handler, service, bridge, front, outbox):
        bridge._handle(front, message(service, (1, list(rows[:4])), (2, [rows[4]]),
                                      (3, list(rows[5:])), stacked=True))
        assert service.repository.get().queue.depth == 7
        handler.gate.set()
        await wait_until(lambda: len(outbox.results()) == 4, "every request answered")
        answers = outbox.results()
        for rid, want in ((0, rows[:1]), (1, rows[:4]), (2, rows[4:5]), (3, rows[5:])):
            np.testing.assert_array_equal(np.stack(answers[rid]), 2 * want)
        assert handler.shapes == [[(2,)], [(3, 2)], [(2,), (2,), (2,)], [(2,)]]
        assert service.repository.get().in_flight == 0 and not front.waiting
        registry = service.metrics.registry  # a queue wait and a batch place a row
        await wait_until(lambda: sample(registry, "batchserve_queue_wait_seconds_count") == 8,
                         "a queue wait a row")
        assert sample(registry, "batchserve_batch_size_sum") == 8


async def test_a_request_computed_in_one_chunk_goes_back_as_one_block() -> None:
    """A stacked request whose rows all fit one batch: its answer travels as one block of its
    rows (``block``), not as a value a row."""
    rows = np.arange(6, dtype=np.float32).reshape(3, 2)
    async with busy_rows(3, (0, rows[0])) as (handler, service, bridge, front, outbox):
        bridge._handle(front, message(service, (1, list(rows)), stacked=True))
        handler.gate.set()
        await wait_until(lambda: len(outbox.results()) == 2, "both requests answered")
        (block,) = [values for kind, entry, values in outbox.sent if kind == "block"][0]
        assert type(block) is np.ndarray
        np.testing.assert_array_equal(block, 2 * rows)
        assert handler.shapes[-1] == [(3, 2)]


def one_row_requests(handler: GatedRows, service: InferenceService, stacked: bool
                     ) -> tuple[FrontEndLink, Outbox, np.ndarray]:
    """Arm ``handler``, and send five one-row requests (ids 0-4) in one message, their rows
    ``stacked`` or as a list: the front end's link, what it was sent, and the rows."""
    bridge, (front, outbox) = Bridge(service), link()
    handler.armed = True
    rows = np.arange(10, dtype=np.float32).reshape(5, 2)
    bridge._handle(front, message(service, *[(i, [rows[i]]) for i in range(5)],
                                  stacked=stacked))
    return front, outbox, rows


async def test_one_row_requests_queue_as_one_chunk_each_answered_on_its_own() -> None:
    """Five one-row requests in one message to a model whose rows stack: admitted in order
    (the last refused at once: no room), queued as one chunk, one model call of their rows,
    each answered with its own row; counted as four requests in flight, then none."""
    handler = GatedRows()
    async with running(handler, max_batch_size=8, queue_capacity=4, max_instances=4) as service:
        front, outbox, rows = one_row_requests(handler, service, stacked=True)
        assert outbox.results() == {4: (503, "busy")}
        model = service.repository.get()
        assert model.in_flight == 4 and model.queue.depth == 4
        handler.gate.set()
        await wait_until(lambda: len(outbox.results()) == 5, "every request answered")
        answers = outbox.results()
        for i in range(4):
            np.testing.assert_array_equal(np.stack(answers[i]), 2 * rows[i:i + 1])
        assert handler.shapes == [[(4, 2)]]
        assert model.in_flight == 0 and not front.waiting


@pytest.mark.parametrize(("shape", "stacked"), [((2,), True), (None, True), (None, False)],
                         ids=["rows that stack", "an item a row", "items of each length"])
async def test_a_chunks_rows_are_answered_with_the_batch_that_computed_them(
        shape: tuple[int, ...] | None, stacked: bool) -> None:
    """Five one-row requests in one message are one chunk, one request standing for them, for
    a model whose rows stack (one item) or not (an item a row: a front end sends token ids of
    each length as a list). A batch limit of 3 splits it: the first batch's rows are answered
    while the second batch is held, and their places are freed with the chunk's, once every
    row is answered."""
    handler = GatedRows(shape)
    handler.gate = Turnstile()
    async with running(handler, max_batch_size=3, queue_capacity=16, max_instances=8) as service:
        front, outbox, rows = one_row_requests(handler, service, stacked)
        model = service.repository.get()
        assert model.in_flight == 5 and model.queue.depth == 5
        handler.gate.set()
        await wait_until(lambda: len(outbox.results()) == 3, "the first batch's rows answered")
        await asyncio.sleep(0.05)  # the second batch is held at the gate
        assert sorted(outbox.results()) == [0, 1, 2] and len(handler.shapes) == 1
        assert model.in_flight == 5 and sorted(front.waiting) == list(range(5))
        handler.gate.set()
        await wait_until(lambda: len(outbox.results()) == 5, "every request answered")
        answers = outbox.results()
        for i in range(5):
            np.testing.assert_array_equal(np.stack(answers[i]), 2 * rows[i:i + 1])
        assert handler.shapes == ([[(3, 2)], [(2, 2)]] if shape else
                                  [[(2,)] * 3, [(2,)] * 2])
        assert model.in_flight == 0 and not front.waiting


async def test_a_chunks_row_cancelled_or_past_its_deadline_is_dropped_uncomputed() -> None:
    """Of four one-row requests queued as one chunk while the device is busy, one is
    cancelled and one's deadline passes: the model computes the other two rows only (runs of
    one), those two are answered, the expired one gets its 504, the cancelled one nothing."""
    rows = np.arange(10, dtype=np.float32).reshape(5, 2)
    async with busy_rows(8, (9, rows[4])) as (handler, service, bridge, front, outbox):
        model = service.repository.get()
        soon, later = time.monotonic() + 0.2, time.monotonic() + 30.0
        # request ids 10-13 (a front end's ids are not rows): 11 is cancelled, 12 expires
        entries = [(10 + i, soon if i == 2 else later, None, 1) for i in range(4)]
        bridge._handle(front, grouped(service, entries, ("stacked", rows[:4])))
        bridge._handle(front, {"cancel": [11]})
        assert model.in_flight == 5
        await asyncio.sleep(0.3)  # request 12's deadline passes while it is queued
        handler.gate.set()
        await wait_until(lambda: len(outbox.results()) == 4, "the others answered")
        answers = outbox.results()
        assert 11 not in answers and answers[12] == (504, "timeout")
        for i in (0, 3):
            np.testing.assert_array_equal(np.stack(answers[10 + i]), 2 * rows[i:i + 1])
        assert handler.shapes == [[(2,)], [(2,), (2,)]]
        assert model.in_flight == 0 and not front.waiting
        registry = service.metrics.registry
        await asyncio.sleep(0)  # a batch is counted once its answers are out (ServedModel.deliver)
        assert sample(registry, "batchserve_dropped_items_total", reason="cancelled") == 1
        assert sample(registry, "batchserve_dropped_items_total", reason="expired") == 1


async def acknowledge(bridge: Bridge, front: FrontEndLink, outbox: Outbox) -> None:
    """Answer the ack the bridge asked of ``front`` (once it has asked), as a front end does."""
    await wait_until(lambda: any(kind == "ack" for kind, _, _ in outbox.sent), "an ack asked")
    key = next(entry for kind, entry, _ in outbox.sent if kind == "ack")
    outbox.sent.clear()
    bridge._handle(front, {"acked": [key]})
    await asyncio.sleep(0.05)  # what waits on the ack runs on


async def test_health_says_what_a_front_end_cannot_serve_and_loading_till_all_have_started(
) -> None:
    """One health answer whichever front end a probe reaches: the server reads loading till
    every front end has started with the handlers of its models and holds the snapshot sent
    then; later, a model version some front end cannot serve reads loading (it makes the
    handler) or unavailable (it could not), the server ready; a front end that goes away
    takes what it lacked with it."""
    async with running(EchoHandler()) as service:
        bridge = Bridge(service, frontends=2)
        (one, first), (two, second) = link(), link()
        bridge._links.update((one, two))
        model = service.repository.get()

        def lacking(*statuses: str) -> dict[str, Any]:
            return {"lacking": [[(model.name, model.version, s) for s in statuses]]}

        assert service.status == "loading"  # neither has said it started
        bridge._handle(one, lacking())
        assert service.status == "loading"  # one of two
        bridge._handle(two, lacking("loading"))  # its start ended, the handler not yet made
        assert (service.status, model.health) == ("loading", "loading")
        bridge._handle(two, lacking())
        assert (service.status, model.health) == ("loading", "ready")  # the snapshot not held
        await acknowledge(bridge, one, first)
        assert service.status == "loading"
        await acknowledge(bridge, two, second)
        await wait_until(lambda: service.status == "ready", "ready")
        assert model.health == "ready"
        bridge._handle(one, lacking("unavailable"))
        bridge._handle(two, lacking("loading"))
        assert (service.status, model.health) == ("ready", "unavailable")
        bridge._links.discard(one)  # as its link's end does
        bridge._lacking_changed()
        assert (service.status, model.health) == ("ready", "loading")
        bridge._handle(two, lacking())
        assert (service.status, model.health) == ("ready", "ready")
    async with running(EchoHandler()) as service:
        Bridge(service)  # no front end to wait for (bench/device.py's)
        assert service.status == "ready"


async def test_the_server_reads_loading_till_every_front_end_holds_the_start_up_models(
) -> None:
    """Front ends that started while the start-up loads ran learn of the models they made
    ready by snapshot, and refuse them as loading till then: the server reads loading till
    each has acknowledged a snapshot sent after those loads ended (its handlers made), not
    ready while a front end would still refuse them."""
    async with running(EchoHandler()) as service:
        service.repository.starting = True  # as while a start-up load runs
        bridge = Bridge(service, frontends=2)
        (one, first), (two, second) = link(), link()
        bridge._links.update((one, two))
        for front in (one, two):
            bridge._handle(front, {"lacking": [[]]})  # started, lacking nothing it was sent
        await asyncio.sleep(3 * SNAPSHOT_CHECK_S)
        assert service.status == "loading" and first.sent == second.sent == []
        service.repository.starting = False
        service._signal()  # as the start-up loads' task does when it ends
        await wait_until(lambda: len(second.sent) == 2, "the snapshot sent")
        assert [kind for kind, _, _ in first.sent] == ["models", "ack"]
        assert service.status == "loading"
        await acknowledge(bridge, two, second)
        assert service.status == "loading"  # one of two holds it
        await acknowledge(bridge, one, first)
        await wait_until(lambda: service.status == "ready", "ready")


async def test_a_front_ends_ask_is_answered_by_the_app_in_process() -> None:
    """``ask`` (app/asks.py): the app answers the request, and the answer goes back under the
    ask's token; the app failing is a 500 answer, not a lost one."""
    async def app(scope: Any, receive: Any, send: Any) -> None:
        body = (await receive())["body"]
        if scope["path"] == "/fail":
            raise RuntimeError("the app failed")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": scope["path"].encode() + body})

    async with running(EchoHandler()) as service:
        bridge, (front, outbox) = Bridge(service, app=app), link()
        bridge._handle(front, {"ask": [(7, Asked("POST", "/x", b"/x", b"", [], None, b"!")),
                                       (8, Asked("GET", "/fail", b"/fail", b"", [], None, b""))]})
        await wait_until(lambda: len(outbox.sent) == 2, "both answered")
        replied = {entry[0]: entry[1] for kind, entry, _ in outbox.sent if kind == "replied"}
        assert replied[7] == Replied(200, [], b"/x!") and replied[8].status == 500


async def test_a_load_retires_what_it_replaces_once_every_front_end_holds_the_snapshot(
) -> None:
    """``hold_current`` (a load's ``before_retire``): every front end is sent the snapshot with
    an ack asked; it returns once each has acknowledged, having sent before its ack what it
    routed by the snapshot before (a request in the same message is admitted first)."""
    async with running(EchoHandler()) as service:
        bridge = Bridge(service)
        assert service.before_retire == [bridge.hold_current]
        (one, first), (two, second) = link(), link()
        bridge._links.update((one, two))
        held = asyncio.ensure_future(bridge.hold_current())
        await asyncio.sleep(0.01)
        acks = []
        for outbox in (first, second):
            kinds = [kind for kind, _, _ in outbox.sent]
            assert kinds == ["models", "ack"]
            acks.append(outbox.sent[1][1])
        bridge._handle(one, {"acked": [acks[0]]})
        await asyncio.sleep(0.01)
        assert not held.done()  # one of two
        bridge._handle(two, {**message(service, (5, [1.0])), "acked": [acks[1]]})
        assert two.waiting or {5} <= set(second.results())  # admitted before the ack counted
        await asyncio.wait_for(held, 5)
        await wait_until(lambda: 5 in second.results(), "the request routed before answered")
