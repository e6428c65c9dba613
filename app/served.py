"""ServedModel: one version of a model as requests see it (docs/models.md).

Its handler and settings, its queue, its admission, its requests in flight, and the delivery of
its batches' results. Everything here runs on the event loop's thread except what device
threads use: ``queue``, ``policy``, ``handler`` and reading ``in_flight``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from functools import cached_property
from typing import Any

import torch

from app.arrays import Results
from app.bell import Bell
from app.config import BatchSettings
from app.errors import ServeError
from app.facade import ModelFacade
from app.metrics import ModelMetrics
from app.models.base import ModelHandler, sendable
from app.models.signature import TensorSpec, describe_outputs
from app.pending import DROPPED, PendingRequest, expire, queue_items
from app.queues import ModelQueue
from app.report import BatchReport
from app.scheduler.admission import Gate, closed, room
from app.scheduler.cost import CostModel
from app.scheduler.waiting import BatchPolicy, RecentPeak
from app.state import STATES, ModelState, ServerState
from app.tracing import Tracing

WORK_WEIGHT = 0.05  # how far one batch moves the model's typical work and tokens per item


class ServedModel(ModelFacade):
    """One (name, version): admits requests whole or refuses them whole, and answers each once.

    Its state is written here only: the runtime (app/runtime.py) tells it what changed through
    ``open``, ``serve_with``, ``set_stranded``, ``measure_first`` and ``learn``, the repository
    through ``set_state``; device threads reach it through ``deliver`` on the loop."""

    metrics: ModelMetrics

    def __init__(self, name: str, version: str, settings: BatchSettings, handler: ModelHandler,
                 devices: list[torch.device], metrics: ModelMetrics, spec: str = "",
                 server: ServerState | None = None) -> None:
        super().__init__(name, version, settings, handler)
        self.spec = spec  # the model setting its handler was built from
        self.devices = devices
        self.metrics = metrics
        # The janus queue must hold what the most urgent level may fill.
        self.queue = ModelQueue(self.room(1), settings.priority_levels)
        self.policy = BatchPolicy(self.batch_limit, settings.max_wait_s)
        self.state, self.reason = ModelState.LOADING, ""  # its metric: ModelRepository sets it
        self.in_flight = 0
        self._peak = RecentPeak()  # of in_flight: the clients to expect (``concurrency``)
        self.costs: dict[str, CostModel] = {}  # per device (label); refined on the loop
        self._batch_s: float | None = None  # a full batch's predicted seconds, while valid
        self._first_items: Callable[[list[Any]], None] | None = None  # ``measure_first``
        self.work_per_item = 1.0  # cost-model work of a typical item (padded tokens, for text)
        self.tokens_per_item = 1.0  # a typical item's own length (tokens, for text)
        self._neighbours: list[ServedModel] = []  # the models sharing its devices (and itself)
        self.server = server or ServerState()  # read only here (app/state.py)
        self._bells: list[Bell] = []  # of the device threads serving it (app/bell.py)
        self._ring_due = False
        self._settled: asyncio.Event | None = None  # set once nothing is in flight (``settled``)
        self.stranded = False  # no device thread serving it is alive
        self.tracing: Tracing | None = None

    @cached_property
    def sent_handler(self) -> bytes | None:
        """What front ends decode with (app/snapshot.py): made at the first snapshot, so only
        where there are front ends, and once."""
        return sendable(self.handler)

    def open(self, loop: asyncio.AbstractEventLoop, pool: Executor,
             tracing: Tracing | None = None) -> None:
        """Bind to the running loop (its queue is created there), the decode pool and, when
        traces are on, the tracer."""
        self._loop = loop
        self._pool = pool
        self.tracing = tracing
        self.queue.open()
        self.metrics.watch(lambda: self.queue.depth, lambda: self.in_flight)

    def serve_with(self, bells: list[Bell], neighbours: list[ServedModel]) -> None:
        """The device threads serving it now (their bells; none once removed) and the models
        they also serve (its deadline predictions count them: they take turns)."""
        self._bells, self._neighbours = bells, neighbours

    def set_stranded(self, stranded: bool) -> None:
        """No live device thread serves it (health says unhealthy, admission refuses)."""
        self.stranded = stranded

    def measure_first(self, hook: Callable[[list[Any]], None]) -> None:
        """Hand the first request's items to ``hook`` (once), for a model whose warm-up could
        measure no cost (no examples): the runtime measures one from them."""
        self._first_items = hook

    def set_state(self, state: ModelState, reason: str = "", publish: bool = True) -> None:
        """``publish``: also in the state metric (not for a version whose reload replaced it)."""
        self.state = state
        self.reason = reason
        if publish:
            self.metrics.state(state.value, STATES)

    # ---- what the model is -----------------------------------------------------------------------

    @property
    def health(self) -> str:
        """ready, busy, loading, unloading, unavailable, unhealthy or draining."""
        if self.server.draining:
            return "draining"
        if self.state is not ModelState.READY:
            return str(self.state.value).lower()
        if self.stranded:
            return "unhealthy"
        lacking = self.server.frontends_lack.get((self.name, self.version))
        if lacking is not None:  # a front end cannot serve it (yet): loading, unavailable
            return lacking
        return "busy" if self.queue.depth >= self.room(self.settings.default_level) else "ready"

    def room(self, level: int) -> int:
        """How full the queue may be for a request at ``level`` to join (app/scheduler/)."""
        s = self.settings
        return room(s.queue_capacity, s.priority_levels, s.default_level, level)

    def full_batch_s(self) -> float | None:
        """A full batch's predicted seconds (None: not known yet), kept until the next batch
        teaches something; None too while the cost model does not cover a full batch (a model
        with no warm-up examples, until its first request's measurement lands): its one batch
        scaled up would refuse requests on waits that are not there."""
        if self._batch_s is None:
            cost = next(iter(self.costs.values()), None)
            work = self.batch_limit * self.work_per_item
            if cost is None or not cost.covers(work):
                return None
            self._batch_s = cost.predict(work)
        return self._batch_s

    def learn(self, device: str, cost: CostModel, work_per_item: float,
              outputs: list[TensorSpec] | None, fits: int) -> None:
        """What a replica's warm-up on ``device`` measured: its cost model, a typical item's
        work, the outputs (kept from the first replica) and the largest batch that fits."""
        self.fits = min(self.fits or fits, fits)
        self.costs[device] = cost
        self.work_per_item = self.tokens_per_item = work_per_item
        self.outputs = self.outputs or outputs
        self._batch_s = None

    def concurrency(self) -> int:
        """Requests to expect in flight: admitted now, or the most at once in the last one to
        two seconds (a closed-loop client answered a moment ago is on its way back)."""
        return max(self.in_flight, self._peak.value(time.monotonic()))

    # ---- the request path ------------------------------------------------------------------------

    def gate(self, level: int) -> Gate:
        """Admission at ``level`` against the queue as it stands (app/scheduler/admission.py);
        Unavailable at once while the model is not serving."""
        if self.state is not ModelState.READY or self.server.draining or self.stranded:
            raise closed(self.health, self.name, self.reason)
        queue = self.queue
        sharing = sum(1 for m in self._neighbours if m is self or m.queue.depth)
        return Gate(self.name, self.settings.queue_capacity, level, self.room(level),
                    queue.depth, queue.depth_through(level), self.batch_limit,
                    self.full_batch_s(), sharing, len(self.devices))

    def check_admissible(self, n: int, level: int | None = None,
                         deadline: float | None = None) -> None:
        """Raise Unavailable unless a request of ``n`` items at ``level`` (None: the default)
        can be queued whole right now and, given a ``deadline``, be answered before it."""
        self.gate(level or self.settings.default_level).admit(n, deadline, time.monotonic())

    def enqueue(self, items: list[Any], deadline: float, level: int | None = None,
                trace: Any = None, admitted: int | None = None) -> PendingRequest:
        """Admit a request whole at ``level`` (None: the default) or refuse it whole
        (Unavailable). Never waits. ``trace``: the request's span, when tracing is on.
        ``admitted``: how many items the caller's ``check_admissible`` at this level passed, with
        nothing run on the event loop since; the check is repeated unless that is these items.

        From here the request's future resolves exactly once: to its results, to an error, or to
        DeadlineExceeded when its deadline passes first (one timer, cancelled in ``result``).
        """
        level = level or self.settings.default_level
        if admitted != len(items):
            self.check_admissible(len(items), level)
        assert self._loop is not None
        now = time.monotonic()
        future = self._loop.create_future()
        request = PendingRequest(future, len(items), deadline, now, level)
        request.trace = trace
        self.put_admitted([(request, items)], now)
        request.timer = self._loop.call_later(deadline - now, expire, future)
        return request

    def put_admitted(self, admitted: list[tuple[PendingRequest, Any]], now: float) -> None:
        """Put admitted requests' items (all at one level; admitted through ``gate``, with
        nothing run on the event loop since) into the queue together, count the requests in
        flight, and ring a device thread that wants them."""
        # Only this thread puts, and device threads only take, so the capacity checks before
        # guarantee the put succeeds; the requests' items go in together, never partly.
        handler = self.handler
        self.queue.put_all(queue_items(admitted, handler.key, handler.stacks))
        if self._first_items is not None:
            hook, self._first_items = self._first_items, None
            hook(admitted[0][1])
        self.in_flight += sum(request.count for request, _ in admitted)
        self._peak.note(self.in_flight, now)
        # Rung once this pass of the event loop is done: a burst of requests that arrived
        # together is queued before the thread wakes (and takes the GIL).
        if not self._ring_due and self._wanting():
            assert self._loop is not None
            self._ring_due = True
            self._loop.call_soon(self._ring)

    def _wanting(self) -> list[Bell]:
        depth = self.queue.depth
        return [bell for bell in self._bells if bell.wants(self, depth)]

    def _ring(self) -> None:
        self._ring_due = False
        for bell in self._wanting():
            bell.ring()

    async def result(self, request: PendingRequest) -> Results:
        """Wait for a request's results, one an instance (DeadlineExceeded once its deadline
        passes): a list, or where its rows were computed together, their array (one block)."""
        future = request.future
        assert isinstance(future, asyncio.Future)  # ``enqueue``'s, not app/intake.py's
        try:
            return await future
        finally:
            self.finish(request)

    async def settled(self) -> None:
        """Until every admitted request is answered (or its client gone)."""
        while self.in_flight:
            self._settled = asyncio.Event()
            await self._settled.wait()
        self._settled = None

    def finish(self, request: PendingRequest) -> None:
        """A request's waiter is done with it: answered, or gone (then its queued items are
        dropped before they reach the device). Once per request."""
        self.in_flight -= request.count
        if not self.in_flight and self._settled is not None:
            self._settled.set()
        if request.timer is not None:
            request.timer.cancel()
        if not request.future.done():
            request.future.cancel()

    def deliver(self, report: BatchReport) -> None:
        """Resolve futures from one batch (scheduled by a device thread on the loop), then count
        and learn from it once their answers are written."""
        if self.tracing is not None:  # first: requests already answered (timed out) get no spans
            self.tracing.batch(self.name, report)
        waits = report.answer()
        # Scheduled after the resolved futures' callbacks: in a closed loop the device waits for
        # these answers to go out and the next requests to come in, not for the bookkeeping.
        asyncio.get_running_loop().call_soon(self._account, report, waits)

    def _account(self, report: BatchReport, waits: list[float]) -> None:
        """A batch's metrics, and what it teaches: the cost model of its device (seconds per
        unit of work) and this model's typical item (its work, and its real tokens)."""
        self.metrics.batch(report, waits)
        cost = self.costs.get(report.device)
        for size, seconds, work, tokens in zip(report.sizes, report.compute_s, report.work,
                                               report.tokens, strict=True):
            if cost is not None:
                cost.observe(work, seconds)
            self.work_per_item += WORK_WEIGHT * (work / size - self.work_per_item)
            self.tokens_per_item += WORK_WEIGHT * (tokens / size - self.tokens_per_item)
        self._batch_s = None
        if self.outputs is None:  # no warm-up results: the first batch's describe the outputs
            values = [v if item.rows == 1 else v[0] for item, v in report.results
                      if not isinstance(v, ServeError) and v is not DROPPED]
            self.outputs = describe_outputs(values) if values else None

