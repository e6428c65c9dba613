"""Ten times the server's capacity, open loop, from outside: every request is answered exactly
once (200, 503 + Retry-After, or 504), none waits much past its deadline, memory stays bounded,
and afterwards the server is ready and as fast as before."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import WAIT_S, sample, serve, wait_ready, wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

SLEEP_S = 0.1  # per model call
MAX_BATCH = 2  # capacity: MAX_BATCH / SLEEP_S = 20 items/s
TIMEOUT_S = 1.0
RATE = 200  # requests/s offered: 10 x capacity
SECONDS = 3.0
BODY = {"instances": [[1.0, 2.0]]}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def timed_post(client: httpx.AsyncClient) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = await client.post("/predict", json=BODY)
    return response, time.monotonic() - started


async def lone_latencies(client: httpx.AsyncClient, n: int = 5) -> list[float]:
    out = []
    for _ in range(n):
        response, seconds = await timed_post(client)
        assert response.status_code == 200
        out.append(seconds)
    return out


async def open_loop(client: httpx.AsyncClient) -> list[tuple[httpx.Response, float]]:
    """Send at RATE per second for SECONDS, whatever the answers: arrivals do not wait."""
    tasks = []
    start = time.monotonic()
    for i in range(int(RATE * SECONDS)):
        delay = start + i / RATE - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(timed_post(client)))
    return await asyncio.gather(*tasks)


async def test_ten_times_capacity_is_answered_once_and_recovers() -> None:
    args = ("--model", "tests.fakes:sleep_module", "--devices", "cpu",
            "--max-batch-size", str(MAX_BATCH), "--queue-capacity", "8", "--max-instances", "2",
            "--request-timeout-s", str(TIMEOUT_S), "--log-level", "warning")
    # Enough connections for every request in flight (about RATE x TIMEOUT_S), kept alive and
    # reused, so arrivals are not held back by the client.
    limits = httpx.Limits(max_connections=400, max_keepalive_connections=400)
    with serve(*args, env={"SLEEP_S": str(SLEEP_S)}) as (proc, url):
        wait_ready(url)
        async with httpx.AsyncClient(base_url=url, timeout=WAIT_S, limits=limits) as client:
            idle = await lone_latencies(client)
            rss_before = rss_bytes(proc.pid)

            answers = await open_loop(client)

            rss_after = rss_bytes(proc.pid)

            async def settled() -> bool:
                text = (await client.get("/metrics")).text
                return (sample(text, "batchserve_in_flight_requests") == 0
                        and sample(text, "batchserve_queue_depth") == 0)

            await wait_until(settled, "queue drained")
            health = await client.get("/health_check")
            text = (await client.get("/metrics")).text
            after = await lone_latencies(client)

    sent = len(answers)
    statuses = [r.status_code for r, _ in answers]
    assert set(statuses) <= {200, 503, 504}, sorted(set(statuses))
    assert statuses.count(503) > sent / 2, "the load was not an overload"
    assert statuses.count(200) > 0
    for response, _ in answers:
        if response.status_code == 200:
            assert response.json() == {"predictions": [[2.0, 4.0]]}
        else:
            assert response.json()["error"]["type"] in {"busy", "timeout"}
        if response.status_code == 503:
            assert response.headers["retry-after"] == "1"
    # exactly once: the server counted one answer per request sent, no more, no fewer
    answered = sum(sample(text, "batchserve_requests_total", status=str(s))
                   for s in (200, 503, 504))
    assert answered == sent + len(idle)
    assert max(seconds for _, seconds in answers) < TIMEOUT_S + 1.0
    # and as the server saw it: every answer within the bucket that holds TIMEOUT_S + 1 s
    in_time = sample(text, "batchserve_request_duration_seconds_bucket", le="2.5")
    assert in_time == sample(text, "batchserve_request_duration_seconds_count") == answered
    assert rss_after - rss_before < 64 * 2**20, (rss_before, rss_after)
    assert health.status_code == 200 and health.json()["status"] == "ready"
    # back to idle speed: a backlog would add whole SLEEP_S model calls to each lone request
    assert statistics.median(after) < 2 * statistics.median(idle) + SLEEP_S
