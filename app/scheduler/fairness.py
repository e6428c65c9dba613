"""Which model's batch runs next on a device: a fair share of device time (docs/models.md).

Pure: it is handed the candidates and the clock's readings, and told what each batch cost.
One instance per device thread, used by that thread only.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass
class Fairness(Generic[K]):
    """Picks, among the models with waiting items, the one that has used the least device time;
    ties go to the earliest deadline. A model that had nothing waiting at the last pick is caught
    up to the least time of the models that did, so idleness is not banked, and wins a tie, so
    it waits for the batch in progress only (start-time fair queueing)."""

    used_s: dict[K, float] = field(default_factory=dict)
    waiting: set[K] = field(default_factory=set)  # models with items at the last pick

    def pick(self, candidates: list[tuple[K, float]]) -> K:
        """``candidates``: (model, deadline of its oldest waiting item), at least one. Every
        choice goes through here, one candidate or several: catching up needs to know who
        was waiting."""
        if len(candidates) == 1 and candidates[0][0] in self.waiting:
            self.waiting = {candidates[0][0]}
            return candidates[0][0]
        before = self.waiting
        busy = [self.used_s.get(key, 0.0) for key, _ in candidates if key in before]
        if busy:
            floor = min(busy)
            for key, _ in candidates:
                if key not in before and self.used_s.get(key, 0.0) < floor:
                    self.used_s[key] = floor
        self.waiting = {key for key, _ in candidates}
        # Least used first; a newcomer wins a tie (it waited for the batch in progress only),
        # then the earliest deadline.
        key, _ = min(candidates,
                     key=lambda c: (self.used_s.get(c[0], 0.0), c[0] in before, c[1]))
        return key

    def charge(self, key: K, seconds: float) -> None:
        """``key``'s batch kept the device busy for ``seconds``."""
        self.used_s[key] = self.used_s.get(key, 0.0) + seconds

    def forget(self, key: K) -> None:
        self.used_s.pop(key, None)
        self.waiting.discard(key)
