"""The Python bytecodes one thread runs, by function: ``sys.settrace`` with opcode events, from
``start`` to ``stop``, in the thread that calls them. Exact and repeatable where time on a
noisy box is not (``python -m bench.instructions --opcodes``: a front end's a request;
``python -m bench.device --opcodes``: the device process's event loop's a message). The C
that Python calls (simdjson, numpy, uvloop, pickle) is not in the count, and a bytecode's cost
varies: a change that runs fewer can run as many instructions. Tracing makes the thread about
ten times slower, so it is counted at the pace that gives (message sizes, batch sizes)."""

from __future__ import annotations

import sys
from collections import Counter
from types import CodeType, FrameType
from typing import Any

from bench.loop_profile import short

# (file, first line, qualified name, opcodes, calls): one function's counts, as JSON carries
Row = tuple[str, int, str, int, int]


class Opcodes:
    """The bytecodes and calls (a coroutine's every resumption is one) of each function."""

    def __init__(self) -> None:
        self.ran: Counter[CodeType] = Counter()
        self.calls: Counter[CodeType] = Counter()

    def start(self) -> None:
        sys.settrace(self._called)

    def stop(self) -> None:
        sys.settrace(None)

    def __enter__(self) -> Opcodes:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def rows(self) -> list[Row]:
        return [(code.co_filename, code.co_firstlineno, code.co_qualname, count,
                 self.calls[code]) for code, count in self.ran.items()]

    def _called(self, frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        self.calls[frame.f_code] += 1
        return self._opcode

    def _opcode(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            self.ran[frame.f_code] += 1
        return self._opcode


def report(rows: list[Row], per: int, unit: str, top: int) -> str:
    """The total and the ``top`` functions a ``unit`` (``per`` of them counted), summing the
    rows of one function (several processes' counts): opcodes, share, calls."""
    ran: dict[str, list[int]] = {}
    for file, line, name, count, calls in rows:
        where = f"{short(file)}:{line}({name})"
        summed = ran.setdefault(where, [0, 0])
        summed[0] += count
        summed[1] += calls
    total = sum(count for count, _ in ran.values())
    lines = [f"{total / per:,.0f} opcodes and "
             f"{sum(calls for _, calls in ran.values()) / per:.1f} calls a {unit}"]
    for where, (count, calls) in sorted(ran.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"{count / per:8.1f} {100 * count / max(1, total):5.1f} % "
                     f"{calls / per:6.2f}  {where}")
    return "\n".join(lines)
