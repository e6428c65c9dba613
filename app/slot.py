"""Slot: a model placed on a device thread, with that device's batching state for it.

What the device thread needs per model to form its batches: the replica, the batch limit (lowered
after an out-of-memory), the cost model and the recent arrival rate; where the next batch comes
from (the queue in arrival order, or similar lengths for a text model, docs/scheduler.md section
5); and what each batch was worth to the cost model.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.models.base import Replica
from app.pending import PendingItem, rows_in
from app.queues import ModelQueue
from app.report import BatchReport
from app.scheduler.cost import CostModel
from app.scheduler.waiting import ArrivalRate, ItemSource, Price
from app.served import ServedModel
from app.transfer import Launch

BUDGET_SLACK = 2.0  # a text batch's default token budget: this x limit x typical item length


@dataclass(eq=False)
class Slot:
    """A model placed on this device: its replica, and this device's batching state for it."""

    model: ServedModel
    replica: Replica
    batch_limit: int  # lowered after an out-of-memory
    cost: CostModel
    padded: bool  # its batches are padded to their longest item (text): it has lengths
    rate: ArrivalRate = field(default_factory=ArrivalRate)
    # The last failure whose traceback was logged, and when (app/failures.py).
    traced: tuple[str, float] | None = None

    def lengths(self, data: list[Any]) -> list[int]:
        """Each decoded item's length (tokens), for a model that pads to its longest."""
        length = self.model.handler.length
        return [length(d) or 0 for d in data] if self.padded else [1] * len(data)

    def pricing(self, items: list[PendingItem]) -> Price | None:
        """The cost model's price of a batch like ``items`` grown to n items (None: unknown):
        items, or padded tokens (items x the longest) for a model that pads."""
        cost = self.cost
        if not cost.known:
            return None
        per_item = max(self.lengths([i.data for i in items])) if self.padded else 1
        return lambda n: cost.predict_all(n * per_item)

    def source(self) -> ItemSource:
        """Where the next batch comes from: its queue in arrival order, or batches of
        similar lengths within a padded-token budget for a model that pads to its longest item
        (docs/scheduler.md, section 5)."""
        model = self.model
        settings = model.settings
        window = settings.length_window
        if not self.padded or (window <= 1 and settings.max_batch_tokens is None):
            return model.queue
        budget = settings.max_batch_tokens
        if budget is None:  # the typical batch's tokens, with room for longer items
            budget = round(BUDGET_SLACK * self.batch_limit * model.tokens_per_item)
        full = self.cost.predict(self.batch_limit * model.work_per_item)
        return SimilarLengths(model.queue, model.handler.length, max(window, self.batch_limit),
                              budget, time.monotonic() + 2 * full)

    def work(self, items: list[PendingItem]) -> tuple[int, int]:
        """A batch's work for the cost model (items, or padded tokens: items x the longest, for
        a model that pads) and its real tokens (items, for a model that does not)."""
        if not self.padded:
            rows = rows_in(items)
            return rows, rows
        lengths = self.lengths([i.data for i in items])
        return len(items) * max(lengths), sum(lengths)


@dataclass
class SimilarLengths:
    """An ItemSource for a text model: batches of items of similar length (app/queues.py). The
    first take sets the length to match; later takes (after a nap) add to that batch."""

    queue: ModelQueue
    length: Callable[[Any], int | None]
    window: int
    max_tokens: int | None
    due: float  # items due before this join first
    anchor: int | None = None
    held: tuple[int, int] = (0, 0)  # items taken so far, and the longest

    def take(self, limit: int) -> list[PendingItem]:
        items = self.queue.take_similar(limit, self.length, self.window, self.max_tokens,
                                        self.due, self.anchor, self.held)
        if items:
            lengths = [self.length(i.data) or 0 for i in items]
            if self.anchor is None:
                self.anchor = lengths[0]
            self.held = (self.held[0] + len(items), max(self.held[1], *lengths))
        return items


@dataclass
class Launched:
    """A batch of a slot's model whose calls were launched: one (items, launch) per key group,
    and the report its results go into."""

    slot: Slot
    report: BatchReport
    groups: list[tuple[list[PendingItem], Launch]] = field(default_factory=list)

    @property
    def pending(self) -> bool:
        return any(launch.pending for _, launch in self.groups)

    def items(self) -> list[PendingItem]:
        return [item for items, _ in self.groups for item in items]
