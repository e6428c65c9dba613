"""Admission by priority and by predicted finish (docs/scheduler.md, sections 3 and 4). Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from app.errors import ServeError, Unavailable, WouldMissDeadline, busy


def room(capacity: int, levels: int, default: int, level: int) -> int:
    """How full the queue may be for a request at ``level`` to join. The default level gets
    ``capacity``, as configured; each more urgent level ``capacity / levels`` more, each less
    urgent one that much less: under overload the least urgent are refused first, and the urgent
    still find room when ordinary traffic has filled the queue."""
    return max(1, capacity + (default - level) * max(1, capacity // levels))


def predicted_wait_s(ahead: int, batch_limit: int, full_batch_s: float, sharing: int,
                     devices: int) -> float:
    """Seconds until ``ahead`` items (those queued before and with a request, its own
    included) are done: the batch in progress, then batches of the limit at the cost model's
    time for a full one, stretched by the models sharing the device (a fair share each), spread
    over the model's devices."""
    batches = 1 + math.ceil(ahead / batch_limit)
    return batches * full_batch_s * max(1, sharing) / max(1, devices)


@dataclass(slots=True)
class Gate:
    """Admission at one level against a model's queue as it stands: ``room`` (section 3) and,
    where the cost model knows a batch's seconds, the predicted finish (section 4). Built once
    for a run of requests at that level; each one ``admit`` passes is counted as queued ahead of
    the next. Device threads only take items meanwhile, so counting from the depths at build
    time never admits more than the queue has room for."""

    model: str
    capacity: int
    level: int
    limit: int  # ``room`` at this level
    depth: int  # items queued, and admitted through this gate
    through: int  # of those, at this level and the more urgent ones
    batch_limit: int
    full_batch_s: float | None  # None: the cost is not known yet (no deadline refusals)
    sharing: int
    devices: int
    # The longest predicted wait, with the queue full to ``limit``: a deadline further away
    # than this is met whatever is admitted, and needs no prediction of its own.
    longest_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.longest_s = math.inf if self.full_batch_s is None else self.wait_s(self.limit)

    def admit(self, n: int, deadline: float | None, now: float) -> None:
        """Count ``n`` items as queued, or raise Unavailable (no room) or WouldMissDeadline
        (predicted to finish after ``deadline``; ``now``: the clock)."""
        if self.depth + n > self.limit:
            raise busy(self.capacity, self.level, self.limit)
        # With nothing queued ahead of it, a request is served next: refusing it would also
        # keep the cost model from learning (one stalled batch must not refuse all that follow).
        if deadline is not None and self.full_batch_s is not None and self.through:
            left = deadline - now
            wait = self.wait_s(self.through + n) if left < self.longest_s else 0.0
            if wait > left:
                raise deadline_refusal(self.model, wait, left, self.wait_s(self.depth + n))
        self.depth += n
        self.through += n

    def admit_all(self, n: int, earliest: float, now: float) -> bool:
        """Count ``n`` one-item requests as queued if each would pass ``admit`` one after
        another (``earliest``: the soonest of their deadlines); False, counting none, where one
        might not (then ``admit`` them one by one)."""
        if self.depth + n > self.limit:
            return False
        # The last one's predicted wait bounds every one's; a lone first one is never refused.
        if (self.full_batch_s is not None and (self.through or n > 1)
                and earliest - now < self.longest_s
                and self.wait_s(self.through + n) > earliest - now):
            return False
        self.depth += n
        self.through += n
        return True

    def refusal(self, n: int, deadline: float | None, now: float) -> ServeError | None:
        """``admit``, with its refusal returned rather than raised (None: admitted)."""
        try:
            self.admit(n, deadline, now)
        except ServeError as exc:
            return exc
        return None

    def wait_s(self, ahead: int) -> float:
        assert self.full_batch_s is not None
        return predicted_wait_s(ahead, self.batch_limit, self.full_batch_s, self.sharing,
                                self.devices)


def closed(health: str, model: str, reason: str) -> Unavailable:
    """The refusal of a model that is not serving: ``health`` says why."""
    if health == "draining":
        return Unavailable(health, "the server is shutting down")
    return Unavailable(health, f"model '{model}' is {health}{f': {reason}' if reason else ''}")


def retry_after_s(drain_s: float) -> int:
    """Whole seconds for a Retry-After header: at least 1."""
    return max(1, math.ceil(drain_s))


def deadline_refusal(model: str, wait_s: float, left_s: float, drain_s: float
                     ) -> WouldMissDeadline:
    """The refusal of a request predicted to finish ``wait_s`` from now, past its deadline
    ``left_s`` away; ``drain_s``, the whole queue's, says when to retry."""
    when = f"in {_duration(left_s)}" if left_s > 0 else "already passed"
    return WouldMissDeadline(f"model '{model}' would answer in about {_duration(wait_s)}, after "
                             f"the request's deadline ({when})", retry_after_s(drain_s))


def _duration(seconds: float) -> str:
    """``1.25 s`` or ``3.2 ms``: readable whether a deadline is seconds or microseconds away."""
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1000:.4g} ms"
