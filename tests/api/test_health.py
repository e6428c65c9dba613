"""GET /health_check (whole server and ?model=) and GET /metrics, in-process."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import app_client, make_settings, sample

pytestmark = pytest.mark.asyncio


async def test_ready_body() -> None:
    async with app_client(make_settings(queue_capacity=64)) as client:
        r = await client.get("/health_check")
        assert r.status_code == 200
        assert r.json() == {
            "status": "ready", "queue_depth": 0, "queue_capacity": 64,
            "models": [{"model": "linear", "version": "1", "status": "ready", "queue_depth": 0,
                        "queue_capacity": 64}],
        }
        r = await client.get("/health_check", params={"model": "linear"})
        assert r.status_code == 200 and r.json()["status"] == "ready"
        assert r.json()["model"] == "linear" and r.json()["version"] == "1"
        r = await client.get("/health_check", params={"model": "nope"})
        assert r.status_code == 404 and "unknown model 'nope'" in r.json()["error"]["message"]




async def test_metrics_count_requests_and_batches() -> None:
    async with app_client(make_settings()) as client:
        for _ in range(3):
            await client.post("/predict", json={"instances": [[1, 2, 3, 4]] * 2})
        await client.post("/predict", json={"instances": []})
        await client.post("/models/nope/predict", json={"instances": [[1, 2, 3, 4]]})
        # A batch is counted in the loop pass that writes its answers (ServedModel.deliver); an
        # in-process client's next requests may run in that same pass, a socket's never do.
        await asyncio.sleep(0)
        text = (await client.get("/metrics")).text
    labels = {"model": "linear", "version": "1"}
    assert sample(text, "batchserve_requests_total", status="200", **labels) == 3
    assert sample(text, "batchserve_requests_total", status="422", **labels) == 1
    assert sample(text, "batchserve_requests_total", model="", version="", status="404") == 1
    assert sample(text, "batchserve_rejected_total", model="linear", reason="invalid_input") == 1
    assert sample(text, "batchserve_batch_size_sum", model="linear") == 6
    assert sample(text, "batchserve_model_state", state="READY", **labels) == 1
    for name in ("batchserve_request_duration_seconds_bucket", "batchserve_queue_depth",
                 "batchserve_queue_wait_seconds_count", "batchserve_batch_compute_seconds_count",
                 'batchserve_device_busy_ratio{device="cpu"}'):
        assert name in text


async def test_metrics_are_documented_as_what_they_are() -> None:
    """Prometheus' text format, in the OpenAPI document as in the answer (schemathesis ST105)."""
    async with app_client(make_settings()) as client:
        answer = await client.get("/metrics")
        schema = (await client.get("/openapi.json")).json()
    documented = schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(documented) == ["text/plain"]
    assert answer.headers["content-type"].split(";")[0] == "text/plain"


@pytest.mark.parametrize("path", ["/metrics", "/v2/models/stats", "/v2/models/linear/stats",
                                  "/v2/models/linear/versions/1/stats"])
async def test_counts_are_read_once_the_front_ends_have_sent_theirs(path: str) -> None:
    """A scrape and the statistics first await what ``before_scrape`` holds (with front ends:
    each sends the request counts it holds, app/bridge.py), so they count every request
    answered before them."""
    async with app_client(make_settings()) as client:
        service = client.app.state.service  # type: ignore[attr-defined]
        model = service.repository.get("linear")

        async def counts_arrive() -> None:
            model.metrics.answered(200, 0.001)

        service.before_scrape.append(counts_arrive)
        answer = await client.get(path)
        assert answer.status_code == 200
        if path == "/metrics":
            assert sample(answer.text, "batchserve_requests_total", status="200") == 1
        else:
            assert answer.json()["model_stats"][0]["inference_stats"]["success"]["count"] == 1
