"""A job worker's leases and liveness, kept every third of ``job_lease_s``.

Each job the worker holds has its idle time reset (``XCLAIM ... JUSTID``), so no other worker
takes it over while this one works on it; and the worker's counters are published under
``batchserve:worker:<consumer>``, expiring with the lease (docs/jobs.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from app.config import Settings
from app.errors import first_line
from app.jobs.metrics import JobMetrics

log = logging.getLogger("batchserve.jobs")


async def keep_leases(client: aioredis.Redis, settings: Settings, consumer: str,
                      held: Collection[str], metrics: JobMetrics) -> None:
    """Renew and publish until cancelled; a failure is logged and tried again next time."""
    interval = settings.job_lease_s / 3
    while True:
        try:
            await renew(client, settings, consumer, held, metrics)
            await publish(client, settings, consumer, len(held), metrics)
        except (RedisError, OSError) as exc:  # Redis away: a line, not a traceback each time
            log.error("lease renewal failed (Redis: %s); retrying in %.1fs", first_line(exc),
                      interval)
        except Exception:
            log.exception("lease renewal failed; retrying in %.1fs", interval)
        await asyncio.sleep(interval)


async def renew(client: aioredis.Redis, settings: Settings, consumer: str,
                held: Collection[str], metrics: JobMetrics) -> None:
    entries: list[Any] = list(held)
    if entries:
        await client.xclaim(settings.job_stream, settings.job_group, consumer, 0, entries,
                            justid=True)
        metrics.lease_renewals.inc(len(entries))


async def publish(client: aioredis.Redis, settings: Settings, consumer: str, held: int,
                  metrics: JobMetrics) -> None:
    lag = 0
    for group in await client.xinfo_groups(settings.job_stream):
        if group.get("name") in (settings.job_group, settings.job_group.encode()):
            lag = int(group.get("lag") or 0)
    metrics.stream_lag.set(lag)
    state = {"consumer": consumer, "held": held, "stream_lag": lag, "at": time.time()}
    await client.set(f"batchserve:worker:{consumer}", orjson.dumps(state),
                     ex=max(1, int(settings.job_lease_s)))
