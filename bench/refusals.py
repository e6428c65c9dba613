"""``python -m bench.refusals``: what a flood of requests past ``max_connections`` costs.

One process serving ``linear`` at ``--max-connections 4`` with four idle connections held, so
that every request wrk sends is refused 503 (uvicorn closes each such connection, and wrk opens
another). Rounds alternate the server at ``--log-level warning``, where each refusal is a
warning of uvicorn's (written at most once every 10 s: ``Repeats``, app/logs.py), and at
``error``, where none is; each prints the refusals a second and the server's CPU a refusal.
"""

from __future__ import annotations

import argparse
import socket
import statistics
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from bench.run import body_file, cpu_seconds, instance_for, run_wrk, server_process

HELD = 4  # idle connections, as many as the server allows


@contextmanager
def full_server(level: str) -> Iterator[tuple[str, int]]:
    """The server at ``level``, its ``HELD`` places taken: (url, pid)."""
    with server_process(["--model", "linear", "--devices", "cpu", "--max-connections",
                         str(HELD), "--log-level", level,
                         "--read-timeout-s", "3600"]) as (url, pid):  # idle: not cut off
        host, port = url.removeprefix("http://").split(":")
        idle = [socket.create_connection((host, int(port))) for _ in range(HELD)]
        try:
            yield url, pid
        finally:
            for sock in idle:
                sock.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.refusals")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    per: dict[str, list[float]] = {"warning": [], "error": []}
    with body_file([instance_for("linear", 0)]) as body, ExitStack() as stack:
        servers = {level: stack.enter_context(full_server(level)) for level in per}
        for _ in range(args.rounds):
            line = []
            for level, (url, pid) in servers.items():
                cpu0 = cpu_seconds(pid)
                r = run_wrk(url, body, args.concurrency, args.seconds, threads=2)
                refused = r["http_errors"]
                if refused != r["requests"]:
                    raise SystemExit(f"bench: {r['requests'] - refused} requests were served")
                us = (cpu_seconds(pid) - cpu0) / refused * 1e6
                per[level].append(us)
                line.append(f"{level}: {refused / (r['duration_us'] / 1e6):,.0f} refusals/s, "
                            f"{us:.1f} us a refusal")
            print(",  ".join(line), flush=True)
    print("medians, server CPU a refusal: " + ", ".join(
        f"{level} {statistics.median(values):.1f} us" for level, values in per.items()))


if __name__ == "__main__":
    main()
