"""CostModel: what a batch costs, measured and refined (docs/scheduler.md, section 1).

Pure. The seconds a batch takes as a function of its work: items for tensor models, padded
tokens for text models. Linear between measured points, extrapolated from the last two beyond
them; each batch served moves the nearest point towards what it took, by a tenth of the
point's seconds at most (an outlier, such as a thread's cold first call, moves it little).
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

REFINE_WEIGHT = 0.1  # how far one observed batch moves the nearest point
REFINE_RATIO = 2.0  # one batch counts as at most this many times slower than expected


@dataclass
class CostModel:
    """Seconds per batch by work. ``work`` ascending; created from measurements."""

    work: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    @classmethod
    def measured(cls, samples: Iterable[tuple[float, float]]) -> CostModel:
        """From (work, seconds) samples: the median per work value."""
        by_work: dict[float, list[float]] = {}
        for work, seconds in samples:
            by_work.setdefault(work, []).append(seconds)
        ordered = sorted(by_work)
        return cls(ordered, [statistics.median(by_work[w]) for w in ordered])

    @property
    def known(self) -> bool:
        return bool(self.work)

    def covers(self, work: float) -> bool:
        """Whether ``predict(work)`` rests on a curve: two points or more, or one at ``work``
        or beyond. One batch seen, scaled up to a larger one, is no curve (often it was a
        thread's cold first call)."""
        return len(self.work) > 1 or (self.known and work <= self.work[0])

    def predict(self, work: float) -> float:
        """Seconds for a batch of ``work`` (0 when nothing is known yet). One value, in plain
        Python: the event loop asks once a batch, where numpy's call costs more than this."""
        xs, ys = self.work, self.seconds
        if not xs:
            return 0.0
        if len(xs) == 1:
            return ys[0] * max(1.0, work / xs[0])  # one point: proportional beyond it
        i = bisect.bisect_left(xs, work)
        i = min(max(i, 1), len(xs) - 1)  # the segment [i-1, i], or the last one beyond it
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        if work <= x0:
            return y0
        return max(0.0, y0 + (y1 - y0) * (work - x0) / (x1 - x0))

    def predict_all(self, work: np.ndarray) -> np.ndarray:
        """``predict`` of each of ``work``, at once: a device thread prices every batch size
        it might wait for in one call (app/scheduler/waiting.py)."""
        # A reader may meet ``take`` between the two lists: use the points both hold.
        xs, ys = self.work, self.seconds
        n = min(len(xs), len(ys))
        if n == 0:
            return np.zeros(len(work))
        x, y = np.asarray(xs[:n], dtype=np.float64), np.asarray(ys[:n], dtype=np.float64)
        if n == 1:
            return np.asarray(y[0] * np.maximum(1.0, work / x[0]))  # one point: proportional
        seconds = np.asarray(np.interp(work, x, y))  # at or below the first point: its seconds
        beyond = work > x[-1]
        if beyond.any():  # extrapolated from the last two points
            slope = (y[-1] - y[-2]) / (x[-1] - x[-2])
            seconds[beyond] = np.maximum(0.0, y[-1] + slope * (work[beyond] - x[-1]))
        return seconds

    def observe(self, work: float, seconds: float) -> None:
        """A batch of ``work`` took ``seconds``: move the nearest point towards it (the event
        loop; device threads read it meanwhile)."""
        if not self.work:
            self.seconds = [seconds]  # before ``work``: a reader that sees a point sees both
            self.work = [work]
            return
        i = min(range(len(self.work)), key=lambda j: abs(self.work[j] - work))
        expected = self.predict(work)
        if expected <= 0.0:
            return
        # The error relative to the prediction, scaled to the point's own seconds. Clipped
        # above, so one batch far off (a thread's cold first call, a page fault) moves the point
        # by a tenth at most; below it cannot move it by more anyway.
        ratio = min(seconds / expected, REFINE_RATIO)
        self.seconds[i] += REFINE_WEIGHT * (ratio - 1.0) * self.seconds[i]

    def take(self, measured: CostModel) -> None:
        """Hold ``measured``'s points instead of its own (a curve measured after the model
        started serving; device threads read it meanwhile: seconds first, then work, so a
        reader never indexes past either)."""
        self.seconds = list(measured.seconds)
        self.work = list(measured.work)

    def curve(self) -> list[tuple[float, float]]:
        return list(zip(self.work, self.seconds, strict=True))


def grid(limit: int) -> list[int]:
    """Batch sizes to measure: 1, 2, 4, ... and the limit itself."""
    sizes, n = [], 1
    while n < limit:
        sizes.append(n)
        n *= 2
    return [*sizes, limit]
