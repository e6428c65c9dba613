"""``python -m bench.accepts``: new connections to a busy server (app/accepting.py).

For each ``--frontends`` N, a server on ``linear``: a burst of ``--burst`` connections opened at
once, each asking ``GET /health_check`` and closing (load balancers' probes, a pool opened
anew), first on the idle server, then beside wrk's ``--concurrency`` keep-alive clients; each
burst's time to an answer (median, 90th percentile, most) and how many were answered. Then
wrk with a new connection a request (``Connection: close``): requests a second and the whole
server's CPU a request, the cost of accepting. With ``--base DIR`` each point runs on that
checkout too, rounds alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from typing import Any

from bench.frontends import per_process_cpu, tree
from bench.run import body_file, instance_for, run_wrk, server_process

PROBE = b"GET /health_check HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"


async def probe(host: str, port: int) -> float | None:
    """Seconds from connecting to the whole answer; None if none came within 30 s."""
    started = time.monotonic()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 30)
        writer.write(PROBE)
        answer = await asyncio.wait_for(reader.read(), 30)
        writer.close()
    except OSError:  # refused, reset, or no answer in 30 s (TimeoutError is one)
        return None
    return time.monotonic() - started if answer.startswith(b"HTTP/1.1 200") else None


def burst(url: str, count: int) -> str:
    host, port = url.removeprefix("http://").split(":")

    async def all_at_once() -> list[float | None]:
        return await asyncio.gather(*(probe(host, int(port)) for _ in range(count)))

    times = sorted(t for t in asyncio.run(all_at_once()) if t is not None)
    if not times:
        return f"0 of {count} answered"
    ms = [t * 1000 for t in times]
    return (f"{len(ms)} of {count} answered, median {statistics.median(ms):,.0f} ms, "
            f"p90 {ms[int(0.9 * (len(ms) - 1))]:,.0f}, most {ms[-1]:,.0f}")


def point(url: str, pid: int, body: str, args: argparse.Namespace) -> list[str]:
    idle = burst(url, args.burst)
    busy: dict[str, Any] = {}
    wrk = threading.Thread(target=lambda: busy.update(
        run_wrk(url, body, args.concurrency, args.busy_seconds)))
    wrk.start()
    time.sleep(args.busy_seconds / 3)  # wrk's clients connected and busy
    beside = burst(url, args.burst)
    wrk.join()
    pids = tree(pid)
    cpu = sum(per_process_cpu(pids))
    fresh = run_wrk(url, body, 16, args.seconds, env={"BENCH_CLOSE": "1"})
    per_request = (sum(per_process_cpu(pids)) - cpu) / max(1, fresh["requests"]) * 1e6
    return [f"burst on the idle server: {idle}",
            f"burst beside {args.concurrency} busy clients: {beside} (those clients: "
            f"p99 {busy['p99_us'] / 1000:,.1f} ms)",
            f"a new connection a request (16 clients): "
            f"{fresh['requests'] / (fresh['duration_us'] / 1e6):,.0f} req/s, "
            f"{per_request:,.0f} us of the server's CPU a request, "
            f"{fresh['socket_errors']} socket errors"]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.accepts")
    parser.add_argument("--frontends", default="1,2", help="comma list of N (1,2)")
    parser.add_argument("--burst", type=int, default=200, help="connections at once (200)")
    parser.add_argument("--concurrency", type=int, default=256, help="busy clients (256)")
    parser.add_argument("--busy-seconds", type=float, default=9.0)
    parser.add_argument("--seconds", type=float, default=4.0, help="a new connection a request")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--base", help="another checkout, run in turn with this one")
    args = parser.parse_args()
    checkouts: dict[str, str | None] = {"this build": None}
    if args.base:
        checkouts["base"] = args.base
    with body_file([instance_for("linear", 0)]) as body:
        for round_ in range(1, args.rounds + 1):
            for n in args.frontends.split(","):
                for name, cwd in checkouts.items():
                    flags = ["--model", "linear", "--devices", "cpu", "--frontends", n]
                    with server_process(flags, cwd=cwd) as (url, pid):
                        lines = point(url, pid, body, args)
                    print(f"round {round_}, {n} front end(s), {name}:", flush=True)
                    for line in lines:
                        print(f"  {line}", flush=True)


if __name__ == "__main__":
    main()
