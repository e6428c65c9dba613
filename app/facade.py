"""ModelFacade: what the request path needs of one model version, wherever its queue lives.

The event loop that parses and decodes a request (its handler, settings and limits) sees this;
``ServedModel`` (app/served.py) is the version whose queue is in this process, and a front end's
``RemoteModel`` (app/frontend/remote.py) the one whose queue is in the device process. Both
admit, enqueue and answer as the contract says; the request path cannot tell them apart.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, Protocol

from app.arrays import Results
from app.config import BatchSettings
from app.errors import DeadlineExceeded, InvalidInput
from app.models.base import ModelHandler, abandonable
from app.models.signature import INPUT_NAME, OUTPUT_NAME, TensorSpec
from app.pending import Answer
from app.process import usable_cores
from app.tasks import DaemonPool

INLINE_DECODE_MAX_ITEMS = 64  # light decodes of small requests stay on the loop
DECODE_THREADS = 4  # at most, in each process that decodes


def decode_pool() -> DaemonPool:
    """The threads that decode heavy or large requests. Daemon threads: a model's decode that
    never returns (stuck on its input) keeps no stopping process from exiting."""
    return DaemonPool("decode", min(DECODE_THREADS, usable_cores()))


class RequestCounts(Protocol):
    """The request path's metrics of one model version."""

    def answered(self, status: int, seconds: float, protocol: str = "http") -> None: ...

    def rejected(self, reason: str) -> None: ...


# What counts a request answered before any route took it: its status, the reason, and the
# seconds since it began.
Refusals = Callable[[int, str, float], None]


def refusals(counts: RequestCounts, protocol: str) -> Refusals:
    """What counts a request refused before any route took it (past ``max_connections``, not
    HTTP, its head too large or too slow) in ``counts``, the server's requests for no model:
    answered with its status, and rejected for its reason."""
    def count(status: int, reason: str, seconds: float) -> None:
        counts.rejected(reason)
        counts.answered(status, seconds, protocol)

    return count


class Waiting(Protocol):
    """An enqueued request as its caller holds it: a future resolved exactly once (an
    ``Answer`` only where app/intake.py queued it, for a front end)."""

    @property
    def future(self) -> asyncio.Future[Results] | Answer: ...


class ModelFacade(ABC):
    """One (name, version) as the request path sees it: its handler's decoding, its settings'
    limits and levels, and admission, enqueueing and the answer (the subclass's)."""

    metrics: RequestCounts

    def __init__(self, name: str, version: str, settings: BatchSettings,
                 handler: ModelHandler) -> None:
        self.name = name
        self.version = version
        self.settings = settings
        self.handler = handler
        self.outputs: list[TensorSpec] | None = None  # learned from the warm-up results
        self.fits: int | None = None  # the largest batch the warm-up could run, if it ran out
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: Executor | None = None

    @property
    def batch_limit(self) -> int:
        """The most items in one model call: the setting, or less where the model says so or
        where a larger batch ran out of device memory at warm-up (``fits``)."""
        limit = self.settings.max_batch_size
        if self.handler.max_batch_size is not None:
            limit = min(limit, self.handler.max_batch_size)
        if self.fits is not None:
            limit = min(limit, self.fits)
        return limit

    @property
    def input_spec(self) -> TensorSpec:
        return TensorSpec(INPUT_NAME, self.handler.input_datatype, self.handler.input_shape)

    @property
    def output_specs(self) -> list[TensorSpec] | None:
        """The outputs as the warm-up produced them; without one, the single output the handler
        declares, or None when nothing is known."""
        if self.outputs:
            return self.outputs
        if self.handler.output_shape is None:
            return None
        return [TensorSpec(OUTPUT_NAME, "FP32", self.handler.output_shape)]

    def level_of(self, asked: int | None) -> int:
        """A request's priority level: the one it asked for (0 or None: the default)."""
        if not asked:
            return self.settings.default_level
        if not 1 <= asked <= self.settings.priority_levels:
            raise InvalidInput(f"priority {asked} is out of range: model '{self.name}' has "
                               f"levels 1 (most urgent) to {self.settings.priority_levels}")
        return asked

    def decodes_inline(self, instances: list[Any]) -> bool:
        """Whether ``decode(instances)`` runs on the event loop without awaiting."""
        return len(instances) <= INLINE_DECODE_MAX_ITEMS and self.handler.decodes_inline(instances)

    async def decode(self, instances: list[Any], deadline: float | None = None) -> list[Any]:
        """Validate and pre-process; heavy or large decodes run in the bounded decode pool,
        waited for until ``deadline`` at most (then DeadlineExceeded). A decode left behind (its
        deadline passed, its client gone) is told so (``decode_abandoned``) and runs on till
        it stops or ends, its outcome dropped: one that never asks holds its pool thread as
        long as it takes."""
        if self.decodes_inline(instances):
            return self.handler.decode(instances)
        assert self._loop is not None
        call, abandoned = abandonable(self.handler.decode, instances)
        decoding = self._loop.run_in_executor(self._pool, call)
        try:
            if deadline is None:
                return await decoding
            return await asyncio.wait_for(decoding, deadline - time.monotonic())
        except TimeoutError:
            raise DeadlineExceeded("the request's deadline passed while it was decoded") from None
        finally:
            abandoned.set()  # once answered, a decode still under way works for no one

    @abstractmethod
    def check_admissible(self, n: int, level: int | None = None,
                         deadline: float | None = None) -> None:
        """Raise Unavailable unless ``n`` items at ``level`` may be queued now (and, given a
        ``deadline``, answered before it)."""

    @abstractmethod
    def enqueue(self, items: list[Any], deadline: float, level: int | None = None,
                trace: Any = None, admitted: int | None = None) -> Waiting:
        """Admit a request whole or refuse it whole; never waits."""

    @abstractmethod
    async def result(self, request: Any) -> Results:
        """The request's results, or its error; a request left before its answer is dropped."""
