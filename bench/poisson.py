"""Open-loop (Poisson) load on one or two builds: ``python -m bench.poisson``.

A closed loop of clients is not the only traffic: an open loop's requests come whatever the
server does, at random times. For each rate, each build's server (all up at once, runs
alternating, the order reversed every other round) gets Poisson arrivals for ``--seconds``
from one asyncio client; the table gives p50 and p99 from the moment each request was due, and
the mean batch from the server's metrics. A/B: ``--builds /tmp/old,.`` (checkouts, e.g. a
``git worktree add /tmp/old <commit>``).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from bench.run import batch_totals, instance_for, server_flags, server_process
from bench.soak import percentile


async def post(client: httpx.AsyncClient, body: dict[str, object], due: float) -> float | None:
    r = await client.post("/predict", json=body)
    return time.monotonic() - due if r.status_code == 200 else None


async def poisson(url: str, body: dict[str, object], rate: float, seconds: float,
                  seed: int) -> list[float | None]:
    """Requests at exponential gaps averaging 1 / ``rate`` for ``seconds``: each one's latency
    from its due time (None: not answered 200)."""
    draw = random.Random(seed)
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        await client.post("/predict", json=body)  # a connection up before the clock starts
        tasks = []
        start = due = time.monotonic()
        while due < start + seconds:
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(post(client, body, due)))
            due += draw.expovariate(rate)
        return await asyncio.gather(*tasks)


def run(args: argparse.Namespace) -> int:
    builds = [str(Path(b).resolve()) for b in args.builds.split(",")]
    rates = [float(r) for r in args.rates.split(",")]
    body = {"instances": [instance_for(args.workload, 0)]}
    flags = server_flags(args.workload, args.max_batch_size)
    print(f"{'build':40} {'rate':>6} {'round':>5} {'p50 ms':>8} {'p99 ms':>8} {'batch':>6} "
          f"{'failed':>6}")
    with ExitStack() as stack:
        servers = [stack.enter_context(server_process(flags, cwd=b)) for b in builds]
        for round_ in range(args.rounds):
            for rate in rates:
                order = list(zip(builds, servers, strict=True))[::-1 if round_ % 2 else 1]
                for build, (url, _) in order:
                    items, batches = batch_totals(url)
                    got = asyncio.run(poisson(url, body, rate, args.seconds, seed=round_))
                    items2, batches2 = batch_totals(url)
                    ok = [s for s in got if s is not None]
                    p99 = percentile(ok, 0.99) if ok else float("nan")
                    batch = (items2 - items) / max(batches2 - batches, 1)
                    print(f"{build[-40:]:40} {rate:6.0f} {round_:5d} "
                          f"{statistics.median(ok) * 1e3 if ok else float('nan'):8.2f} "
                          f"{p99 * 1e3:8.2f} {batch:6.2f} {len(got) - len(ok):6d}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.poisson", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="mlp", help="mlp (default), minilm, linear")
    parser.add_argument("--rates", default="100,200", help="requests/s, comma list")
    parser.add_argument("--seconds", type=float, default=8.0, help="per run (8)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over the rates (2)")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--builds", default=".", help="checkouts to compare, comma list (.)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.seconds <= 0:
        print("bench.poisson: --rounds must be >= 1 and --seconds > 0", file=sys.stderr)
        return 2
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
