from __future__ import annotations

import logging

import pytest

from tests.conftest import app_client, make_settings

pytestmark = pytest.mark.asyncio


async def test_request_id_is_taken_or_generated(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="batchserve.access")
    async with app_client(make_settings()) as client:
        r = await client.get("/health_check", headers={"X-Request-ID": "abc-123"})
        assert r.headers["x-request-id"] == "abc-123"
        generated = (await client.get("/health_check")).headers["x-request-id"]
        assert len(generated) == 32
        bad = await client.get("/health_check", headers={"X-Request-ID": "no spaces\tallowed"})
        assert bad.headers["x-request-id"] != "no spaces\tallowed"
        r = await client.post("/predict", json={"instances": []}, headers={"X-Request-ID": "r-9"})
        assert r.headers["x-request-id"] == "r-9" and r.status_code == 422
    access = [rec for rec in caplog.records if rec.name == "batchserve.access"]
    assert any(rec.status == 422 and rec.path == "/predict" for rec in access)  # type: ignore[attr-defined]
