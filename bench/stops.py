"""Requests lost when a busy server stops: ``python -m bench.stops``.

Starts the server (``linear``) with each ``--frontends`` count, has ``--clients`` clients send
``/predict`` without pause on keep-alive connections, sends SIGTERM after ``--busy-s`` and keeps
sending until the server has exited, ``--stops`` times. Every request ends as an answer (200, or
503 ``draining``), a refused connection (nothing was sent: safe to send elsewhere), or a reset
after it was sent: lost, its client cannot tell whether it ran (docs/operations.md, SIGTERM).
Prints each count, summed over the stops; ``--base DIR``: each stop on that checkout too, in
turn.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from collections import Counter

import httpx

from bench.run import server_process

BODY = {"instances": [[1.0, 2.0, 3.0, 4.0]] * 8}


async def _client(client: httpx.AsyncClient, url: str, until: list[float], seen: Counter[str]
                  ) -> None:
    while time.monotonic() < until[0]:
        try:
            seen[str((await client.post(url, json=BODY)).status_code)] += 1
        except httpx.ConnectError:  # nothing sent: the port is closed
            seen["refused"] += 1
            await asyncio.sleep(0.05)
        except httpx.TransportError as exc:  # sent, then the connection dropped unanswered
            seen[f"reset ({type(exc).__name__})"] += 1


async def one_stop(url: str, pid: int, clients: int, busy_s: float, seen: Counter[str]) -> float:
    """Load, SIGTERM, load until the port refuses for a while: the seconds to exit."""
    until = [float("inf")]
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        tasks = [asyncio.create_task(_client(client, url + "/predict", until, seen))
                 for _ in range(clients)]
        await asyncio.sleep(busy_s)
        os.kill(pid, signal.SIGTERM)
        signalled = time.monotonic()
        while _alive(pid) and time.monotonic() - signalled < 60:
            await asyncio.sleep(0.05)
        exited = time.monotonic() - signalled
        until[0] = time.monotonic() + 0.5  # a last attempt of every client, refused
        await asyncio.gather(*tasks)
    return exited


def _alive(pid: int) -> bool:
    """Whether the server process has not exited (reaped or not)."""
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stops", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frontends", default="1,2", help="comma-separated counts")
    parser.add_argument("--stops", type=int, default=8)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--busy-s", type=float, default=1.0)
    parser.add_argument("--base", help="another checkout, stopped in turn with this one")
    args = parser.parse_args(argv)
    trees = {"this": None, **({"base": args.base} if args.base else {})}
    for frontends in args.frontends.split(","):
        seen: dict[str, Counter[str]] = {tree: Counter() for tree in trees}
        exits: dict[str, list[float]] = {tree: [] for tree in trees}
        for _ in range(args.stops):
            for tree, cwd in trees.items():
                flags = ["--model", "linear", "--frontends", frontends]
                with server_process(flags, cwd=cwd) as (url, pid):
                    exits[tree].append(asyncio.run(
                        one_stop(url, pid, args.clients, args.busy_s, seen[tree])))
        for tree in trees:
            print(f"{tree}, frontends {frontends}: {args.stops} stops, exit in "
                  f"{min(exits[tree]):.2f}-{max(exits[tree]):.2f} s; "
                  + ", ".join(f"{k} {v}" for k, v in sorted(seen[tree].items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
