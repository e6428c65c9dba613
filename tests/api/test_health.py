from __future__ import annotations

import pytest

from tests.conftest import app_client, make_settings

pytestmark = pytest.mark.asyncio


async def test_ready_body() -> None:
    async with app_client(make_settings(queue_capacity=64)) as client:
        r = await client.get("/health_check")
        assert r.status_code == 200
        assert r.json() == {"status": "ready", "queue_depth": 0, "queue_capacity": 64}


async def test_metrics_count_requests_and_batches() -> None:
    async with app_client(make_settings()) as client:
        for _ in range(3):
            await client.post("/predict", json={"instances": [[1, 2, 3, 4]] * 2})
        await client.post("/predict", json={"instances": []})
        text = (await client.get("/metrics")).text
    assert 'batchserve_requests_total{status="200"} 3.0' in text
    assert 'batchserve_requests_total{status="422"} 1.0' in text
    assert 'batchserve_rejected_total{reason="invalid_input"} 1.0' in text
    assert "batchserve_batch_size_sum 6.0" in text
    for name in ("batchserve_request_duration_seconds_bucket", "batchserve_queue_depth",
                 "batchserve_queue_wait_seconds_count", "batchserve_batch_compute_seconds_count",
                 'batchserve_device_busy_ratio{device="cpu"}'):
        assert name in text
