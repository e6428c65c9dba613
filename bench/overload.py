"""Overload with priorities and deadlines (issue 12): ``python -m bench.overload``.

The model (bench/slow.py) takes a fixed 200 ms per batch of up to 4 items: 20 items/s, slow
enough that one Python client can offer 10 x that on this 2-core machine. An open-loop client
offers load whatever the answers, one item per request; latency counts from the moment a
request was due to be sent:
- two levels: ordinary requests at 2 x capacity and urgent ones (``X-Priority: 1``) at a
  quarter of capacity;
  each class's answers, refusals and latency;
- a burst at 10 x capacity, every request with a 1 s deadline (``X-Request-Timeout``): goodput
  (answers within their deadline per second), refusals by reason and how fast they came, 504s,
  and answers that came past their deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections import Counter
from typing import Any

import httpx

from bench.run import scrape, server_process

BATCH, BATCH_S = 4, 0.2
CAPACITY = BATCH / BATCH_S  # items/s
BODY = {"instances": [[1.0, 2.0]]}


async def post(client: httpx.AsyncClient, headers: dict[str, str], started: float
               ) -> tuple[int, str, float]:
    r = await client.post("/predict", json=BODY, headers=headers)
    kind = r.json()["error"]["type"] if r.status_code != 200 else "ok"
    return r.status_code, kind, time.monotonic() - started


async def open_loop(client: httpx.AsyncClient, rate: float, seconds: float,
                    headers: dict[str, str]) -> list[tuple[int, str, float]]:
    tasks = []
    start = time.monotonic()
    for i in range(int(rate * seconds)):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(post(client, headers, start + i / rate)))
    return await asyncio.gather(*tasks)


def summary(label: str, answers: list[tuple[int, str, float]], deadline_s: float | None = None
            ) -> dict[str, Any]:
    ok = sorted(s for status, _, s in answers if status == 200)
    kinds = Counter(f"{status} {kind}" for status, kind, _ in answers)
    refused = sorted(s for status, _, s in answers if status == 503)
    row: dict[str, Any] = {
        "class": label, "sent": len(answers), "answers": dict(sorted(kinds.items())),
        "ok_p50_ms": 1000 * statistics.median(ok) if ok else None,
        "ok_p99_ms": 1000 * ok[int(0.99 * (len(ok) - 1))] if ok else None,
        "refusal_p99_ms": 1000 * refused[int(0.99 * (len(refused) - 1))] if refused else None,
    }
    if deadline_s is not None:
        row["ok_past_deadline"] = sum(1 for s in ok if s > deadline_s)
    return row


def show(row: dict[str, Any]) -> None:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}"

    print(f"  {row['class']:<9} sent {row['sent']:>5}  {row['answers']}")
    print(f"  {'':<9} 200s p50 {ms(row['ok_p50_ms'])} ms, p99 {ms(row['ok_p99_ms'])} ms; "
          f"503s p99 {ms(row['refusal_p99_ms'])} ms"
          + (f"; 200s past their deadline: {row['ok_past_deadline']}"
             if "ok_past_deadline" in row else ""))


async def run(url: str, seconds: float) -> None:
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        print(f"two levels: ordinary at {2 * CAPACITY:.0f}/s, urgent at {CAPACITY / 4:.0f}/s, "
              f"{seconds:.0f}s (capacity {CAPACITY:.0f} items/s)")
        ordinary, urgent = await asyncio.gather(
            open_loop(client, 2 * CAPACITY, seconds, {}),
            open_loop(client, CAPACITY / 4, seconds, {"X-Priority": "1"}))
        for row in (summary("ordinary", ordinary), summary("urgent", urgent)):
            show(row)
        await asyncio.sleep(5.0)  # let the queue drain
        before, = scrape(url, "batchserve_requests_total", status="200")
        print(f"\nburst: {10 * CAPACITY:.0f}/s for {seconds:.0f}s, each with a 1 s deadline")
        started = time.monotonic()
        burst = await open_loop(client, 10 * CAPACITY, seconds, {"X-Request-Timeout": "1"})
        took = time.monotonic() - started
        show(summary("burst", burst, deadline_s=1.0))
        good = sum(1 for status, _, s in burst if status == 200 and s <= 1.0)
        after, = scrape(url, "batchserve_requests_total", status="200")
        served = after - before
        print(f"  goodput {good / took:.0f} answers/s within their deadline "
              f"({good / took / CAPACITY:.2f} x capacity); the server counted {served:.0f} "
              f"answers of 200")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.overload", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args(argv)
    os.environ["SLOW_BATCH_S"] = str(BATCH_S)
    flags = ["--model", "bench.slow:fixed_cost", "--devices", "cpu", "--max-batch-size",
             str(BATCH), "--queue-capacity", "64", "--max-instances", "4",
             "--request-timeout-s", "5"]
    with server_process(flags) as (url, _):
        asyncio.run(run(url, args.seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
