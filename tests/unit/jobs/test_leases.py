"""app/jobs/leases.py: renewal goes on through failures, each said in a line."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from redis.exceptions import ConnectionError as RedisConnectionError

from app.config import Settings
from app.jobs.leases import keep_leases
from app.jobs.metrics import JobMetrics


class GoneRedis:
    """A client whose every call fails as when the server has gone; counts the calls."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls = 0

    async def xclaim(self, *_: Any, **__: Any) -> None:
        self.calls += 1
        raise self.error


async def renew_twice(error: Exception) -> GoneRedis:
    client = GoneRedis(error)
    settings = Settings(job_lease_s=0.03)
    task = asyncio.create_task(keep_leases(
        client, settings, "c", ["1-0"], JobMetrics.create(CollectorRegistry())))  # type: ignore[arg-type]
    while client.calls < 2:
        await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return client


@pytest.mark.asyncio
async def test_redis_gone_is_a_line_each_try_without_a_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="batchserve.jobs"):
        await renew_twice(RedisConnectionError("Connection closed by server.\nmore"))
    failures = [r for r in caplog.records if "lease renewal failed" in r.getMessage()]
    assert len(failures) >= 2
    assert all(r.exc_info is None for r in failures)
    assert "(Redis: Connection closed by server.)" in failures[0].getMessage()


@pytest.mark.asyncio
async def test_another_failure_keeps_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="batchserve.jobs"):
        await renew_twice(KeyError("ours"))
    failures = [r for r in caplog.records if "lease renewal failed" in r.getMessage()]
    assert failures and all(r.exc_info is not None for r in failures)
