"""An access line's cost, two ways, side by side in this process.

``record``: through logging (a record, the handler's filters and lock, the formatter), as a
line goes wherever another handler listens. ``direct``: ``log_access`` as a server runs it,
the line made from the request's fields and queued for the writer. Logging is set up as the
server sets it up (``configure_logging``), its writer thread writing to a buffer; rounds
alternate, and the medians are printed per format.

    python -m bench.log_lines [--lines N] [--rounds R]
"""

from __future__ import annotations

import argparse
import io
import logging
import statistics
import sys
import time
from collections.abc import Callable

from app.api.access import log, log_access
from app.logs import configure_logging, request_id


def record() -> None:
    log.log(logging.INFO, "%s", '127.0.0.1 "POST /predict" 200 1.2ms', extra={
        "method": "POST", "path": "/predict", "status": 200, "duration_ms": 1.234,
        "client": "127.0.0.1"})


def direct() -> None:
    log_access(logging.INFO, "127.0.0.1", "POST", "/predict", 200, 1.234)


def per_line(way: Callable[[], None], lines: int) -> float:
    started = time.perf_counter()
    for _ in range(lines):
        way()
    return (time.perf_counter() - started) / lines * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    out = sys.stdout
    request_id.set("af6fe01bb8c4f8ce0000000000000001")
    for fmt in ("text", "json"):
        sys.stderr = io.StringIO()  # the writer's stream: the lines, never shown
        configure_logging("info", fmt)
        us: dict[str, list[float]] = {"record": [], "direct": []}
        for _ in range(args.rounds):
            us["record"].append(per_line(record, args.lines))
            us["direct"].append(per_line(direct, args.lines))
        record_us, direct_us = (statistics.median(us[w]) for w in ("record", "direct"))
        print(f"{fmt}: record {record_us:.2f} us a line, direct {direct_us:.2f} "
              f"({direct_us / record_us:.2f} x)", file=out)
    logging.shutdown()


if __name__ == "__main__":
    main()
