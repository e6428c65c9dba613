"""Traces (app/tracing.py) against a real OTLP/HTTP receiver started here: the exporter's
protobuf requests are decoded with opentelemetry-proto and the spans checked."""

from __future__ import annotations

import asyncio
import threading

import pytest

from app.errors import ConfigError
from app.jobs.messages import parse_job
from app.tracing import Tracing
from tests.conftest import app_client, make_settings, wait_until
from tests.fakes import GatedHandler
from tests.otlp import PARENT_ID, TRACE_ID, TRACEPARENT, attributes, receiving


@pytest.mark.asyncio
async def test_a_requests_spans_arrive_in_the_callers_trace() -> None:
    with receiving() as receiver:
        async with app_client(make_settings(otel_endpoint=receiver.url)) as client:
            r = await client.post("/predict", json={"instances": [[1, 2, 3, 4]] * 3},
                                  headers={"traceparent": TRACEPARENT})
            assert r.status_code == 200
            r = await client.post("/predict", json={"instances": [[1, 2, 3]]})  # untraced: 422
            assert r.status_code == 422
        # Stopping the app sent what was buffered.
    assert set(receiver.paths) == {"/v1/traces"}
    (server,) = [s for s in receiver.named("POST /predict") if s.trace_id.hex() == TRACE_ID]
    assert server.parent_span_id.hex() == PARENT_ID
    assert server.kind == server.SPAN_KIND_SERVER
    assert attributes(server) == {"batchserve.model": "linear", "http.response.status_code": 200}
    children = [s for s in receiver.spans if s.parent_span_id == server.span_id]
    assert sorted(s.name for s in children) == ["device", "queue"]
    for child in children:
        assert child.trace_id == server.trace_id
        assert server.start_time_unix_nano <= child.start_time_unix_nano
        assert child.start_time_unix_nano <= child.end_time_unix_nano <= server.end_time_unix_nano
    (batch,) = receiver.named("batch")
    assert [link.span_id for link in batch.links] == [server.span_id]
    assert attributes(batch)["batchserve.batch_size"] == 3
    assert attributes(batch)["batchserve.model"] == "linear"
    assert attributes(batch)["batchserve.device"] == "cpu"
    assert attributes(batch)["batchserve.compute_s"] > 0
    (device,) = [s for s in children if s.name == "device"]
    assert [link.span_id for link in device.links] == [batch.span_id]
    # A request without a traceparent starts its own trace; its refusal is on its span.
    (refused,) = [s for s in receiver.named("POST /predict") if s is not server]
    assert refused.trace_id != server.trace_id and not refused.parent_span_id
    assert attributes(refused)["http.response.status_code"] == 422


@pytest.mark.asyncio
async def test_v2_requests_are_traced_too() -> None:
    with receiving() as receiver:
        async with app_client(make_settings(otel_endpoint=receiver.url)) as client:
            body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                                "data": [1, 2, 3, 4]}]}
            r = await client.post("/v2/models/linear/infer", json=body,
                                  headers={"traceparent": TRACEPARENT})
            assert r.status_code == 200
    (server,) = receiver.named("POST /v2/models/linear/infer")
    assert server.trace_id.hex() == TRACE_ID and server.parent_span_id.hex() == PARENT_ID


def test_off_unless_an_endpoint_is_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert Tracing.configure(None) is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    tracing = Tracing.configure(None)
    assert tracing is not None
    tracing.shutdown()


def test_a_stop_waits_for_a_silent_collector_a_bounded_time(
        caplog: pytest.LogCaptureFixture) -> None:
    """A collector that does not answer held a server's exit for the exporter's timeout and
    retries (9 s measured); the flush now has ``within_s``, then its spans are dropped."""
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

    released = threading.Event()

    class Silent(SpanProcessor):
        def shutdown(self) -> None:
            released.wait(30)

    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(Silent())
    assert Tracing(provider).shutdown(within_s=0.05) is False
    assert not released.is_set()  # it returned while the flush still waited
    assert "the collector took none of the last spans within 0.05 s" in caplog.text
    released.set()
    quick = TracerProvider(shutdown_on_exit=False)
    quick.add_span_processor(SpanProcessor())
    assert Tracing(quick).shutdown() is True


def test_a_missing_extra_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"pip install 'batchserve\[otel\]'"):
        Tracing.configure("http://127.0.0.1:1")


def test_a_job_carries_its_senders_trace_context() -> None:
    raw = b'{"id": "j1", "instances": [[1, 2, 3, 4]], "traceparent": "%s", "tracestate": 7}' % (
        TRACEPARENT.encode())
    job = parse_job("1-0", {b"job": raw}, max_instances=8)
    assert job.error is None and job.trace == {"traceparent": TRACEPARENT}


@pytest.mark.asyncio
async def test_a_request_that_timed_out_in_the_queue_has_no_device_span() -> None:
    handler = GatedHandler()
    with receiving() as receiver:
        async with app_client(make_settings(otel_endpoint=receiver.url), handler) as client:
            first = asyncio.create_task(client.post("/predict", json={"instances": [1]}))
            await wait_until(handler.entered.is_set, "device busy")
            late = await client.post("/predict", json={"instances": [2]},
                                     headers={"traceparent": TRACEPARENT,
                                              "X-Request-Timeout": "0.05"})
            assert late.status_code == 504
            handler.gate.set()
            assert (await first).status_code == 200
    (timed_out,) = [s for s in receiver.named("POST /predict") if s.trace_id.hex() == TRACE_ID]
    assert attributes(timed_out)["http.response.status_code"] == 504
    assert not [s for s in receiver.spans if s.parent_span_id == timed_out.span_id]
    assert len(receiver.named("device")) == 1  # the first request's
