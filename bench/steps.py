"""Where the device process's event loop spends its CPU a message (``bench.device --steps``).

Each step below is wrapped, in this process only, to add the calling thread's CPU time
(``time.thread_time_ns``: not time waiting for the GIL, nor other threads') and its calls.
Steps nest (decoding is part of reading, admission part of handling); the report shows each
indented under the step that calls it, as microseconds a call and a message read, and the
loop's own: its CPU from the first message on less the top-level steps (polling, callbacks,
tasks). A sampling profiler on this path over-counted what blocks (a write) and missed a third
of its samples; this counts every call, at about 0.4 us a step.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import app.bridge
import app.device_link
import app.intake
import app.links
import app.served

# (depth, owner, attribute, label): the device process's per-message path, in call order.
STEPS: list[tuple[int, Any, str, str]] = [
    (0, app.links.Inbox, "buffer_updated", "read (Inbox.buffer_updated)"),
    (1, app.links, "decode", "decode"),
    (0, app.bridge.Bridge, "_handle", "handle (Bridge._handle)"),
    (1, app.bridge, "admit_rows", "admit rows (intake.admit_rows)"),
    (2, app.served.ServedModel, "gate", "gate"),
    (2, app.intake, "rows_request", "rows_request"),
    (2, app.served.ServedModel, "put_admitted", "put_admitted"),
    (1, app.bridge, "admit_all", "admit requests (intake.admit_all)"),
    (0, app.served.ServedModel, "deliver", "deliver a batch (ServedModel.deliver)"),
    (1, app.device_link.FrontEndLink, "answer_rows", "answer a chunk's rows (answer_rows)"),
    (1, app.device_link.FrontEndLink, "done_rows", "free a chunk (done_rows)"),
    (1, app.device_link.FrontEndLink, "done", "answer a request (done)"),
    (0, app.links.Outbox, "_send", "send (Outbox._send)"),
    (1, app.links, "encode", "encode"),
    (0, app.served.ServedModel, "_ring", "ring a device thread"),
]


@dataclass
class Steps:
    """The counts of the wrapped steps, from the first message read on."""

    spent: dict[str, list[int]] = field(default_factory=dict)  # label: [ns, calls]
    first_ns: int | None = None  # the loop thread's CPU at the first message
    collected: list[int] = field(default_factory=lambda: [0, 0, 0])  # [ns, runs, started]

    def install(self) -> None:
        for _, owner, name, label in STEPS:
            setattr(owner, name, self._wrapped(getattr(owner, name), label))
        gc.callbacks.append(self._collecting)

    def _collecting(self, phase: str, info: dict[str, Any]) -> None:
        """The collector's runs, on whichever thread allocated (mostly the loop): thread CPU."""
        if self.first_ns is None:
            return
        if phase == "start":
            self.collected[2] = time.thread_time_ns()
        else:
            self.collected[0] += time.thread_time_ns() - self.collected[2]
            self.collected[1] += 1

    def _wrapped(self, f: Callable[..., Any], label: str) -> Callable[..., Any]:
        counts = self.spent.setdefault(label, [0, 0])
        clock = time.thread_time_ns

        def step(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            if self.first_ns is None:
                self.first_ns = start
            try:
                return f(*args, **kwargs)
            finally:
                counts[0] += clock() - start
                counts[1] += 1

        return step

    def report(self) -> str:
        """The table: each step's calls, us a call and us a message read."""
        if self.first_ns is None:
            return "no message read"
        messages = max(1, self.spent[STEPS[0][3]][1])
        whole = time.thread_time_ns() - self.first_ns
        lines = [f"{'event loop CPU a message read':<44}{'calls':>10}{'us a call':>11}"
                 f"{'us a msg':>10}"]
        top = 0
        for depth, _, _, label in STEPS:
            ns, calls = self.spent[label]
            top += ns if depth == 0 else 0
            lines.append(f"{'  ' * depth + label:<44}{calls:>10}{ns / max(1, calls) / 1e3:>11.1f}"
                         f"{ns / messages / 1e3:>10.1f}")
        ns, runs, _ = self.collected
        lines.append(f"{'garbage collection (in the steps and out)':<44}{runs:>10}"
                     f"{ns / max(1, runs) / 1e3:>11.1f}{ns / messages / 1e3:>10.1f}")
        lines.append(f"{'the loop own (polling, callbacks, tasks)':<44}{'':>10}{'':>11}"
                     f"{(whole - top) / messages / 1e3:>10.1f}")
        lines.append(f"{'all, from the first message on':<44}{messages:>10}{'':>11}"
                     f"{whole / messages / 1e3:>10.1f}")
        return "\n".join(lines)
