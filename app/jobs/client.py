"""Submitting jobs and collecting their results: ``submit`` (Python) and ``batchserve submit``."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import orjson
import redis.asyncio as aioredis

from app.jobs.messages import RESULT_KEY, RESULTS_STREAM
from app.tracing import CONTEXT_HEADERS

IDLE_CHECK_S = 5.0  # with no announcement for this long, look the missing results up directly


def trace_context() -> dict[str, str]:
    """The caller's current W3C trace context, if it uses OpenTelemetry: the jobs carry it, so
    a worker's spans join the caller's trace."""
    try:
        from opentelemetry.propagate import inject
    except ImportError:
        return {}
    carrier: dict[str, str] = {}
    inject(carrier)
    return {k: v for k, v in carrier.items() if k in CONTEXT_HEADERS}


async def submit_async(
    redis_url: str,
    jobs: Sequence[list[Any]],
    stream: str = "batchserve:jobs",
    timeout_s: float = 600.0,
    progress: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """Enqueue one job per instance list and wait for every result, in order.

    Each result is ``{"id", "status": "ok", "predictions"}`` or ``{"id", "status": "error",
    "error"}``. Raises TimeoutError if results are still missing after ``timeout_s``.
    """
    client = aioredis.Redis.from_url(redis_url)
    try:
        last = await client.xrevrange(RESULTS_STREAM, count=1)
        cursor: Any = last[0][0] if last else b"0-0"  # announcements after this one are new
        ids = [uuid.uuid4().hex for _ in jobs]
        context = trace_context()
        for start in range(0, len(jobs), 500):
            pipe = client.pipeline(transaction=False)
            for job_id, instances in zip(ids[start:start + 500], jobs[start:start + 500],
                                         strict=True):
                job = {"id": job_id, "instances": instances, **context}
                pipe.xadd(stream, {"job": orjson.dumps(job)})
            await pipe.execute()
        missing = set(ids)
        results: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout_s
        last_seen = time.monotonic()

        async def collect(found: list[str]) -> None:
            bodies = await client.mget([RESULT_KEY + i for i in found])
            for job_id, body in zip(found, bodies, strict=True):
                if body is not None and job_id in missing:
                    results[job_id] = orjson.loads(body)
                    missing.discard(job_id)
            if progress is not None and found:
                progress(sum(body is not None for body in bodies))

        while missing:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{len(missing)} of {len(ids)} jobs have no result yet")
            reply: Any = await client.xread({RESULTS_STREAM: cursor}, count=1000,
                                       block=int(min(remaining, 1.0) * 1000) or 1)
            found = []
            for _stream, entries in reply or []:
                for entry, fields in entries:
                    cursor = entry
                    job_id = fields.get(b"id", b"").decode()
                    if job_id in missing:
                        found.append(job_id)
            if found:
                last_seen = time.monotonic()
                await collect(found)
            elif time.monotonic() - last_seen > IDLE_CHECK_S:
                last_seen = time.monotonic()  # announcements trimmed or missed: ask directly
                await collect(sorted(missing))
        return [results[i] for i in ids]
    finally:
        await client.aclose()


def submit(
    redis_url: str,
    jobs: Sequence[list[Any]],
    stream: str = "batchserve:jobs",
    timeout_s: float = 600.0,
    progress: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """Blocking form of ``submit_async``."""
    return asyncio.run(submit_async(redis_url, jobs, stream, timeout_s, progress))
