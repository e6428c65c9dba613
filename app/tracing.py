"""OpenTelemetry traces (the optional ``otel`` extra; README, "Traces").

On only when an OTLP endpoint is configured: ``otel_endpoint`` (``--otel-endpoint``) or the
standard ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``. Off, nothing
here is imported and every caller holds ``None``: a request pays one ``is None`` test.

Spans: one server span per request (or job), continuing the caller's W3C ``traceparent``; under
it, for each batch its items rode, a ``queue`` span (enqueued to batch start) and a ``device``
span (the batch's compute). One ``batch`` span per model call group, with its size, model,
device and compute time, linked to the spans of the requests it served. The device thread only
records times (it already does, for metrics): every span is made on the event loop, from
monotonic times converted once to the wall clock.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from app.errors import ConfigError
from app.version import __version__

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span

    from app.report import BatchReport

log = logging.getLogger("batchserve")

OTLP_ENV = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
# The longest a stop waits for the collector to take the last spans: one that does not answer
# would hold it for the exporter's whole timeout and retries (10 s by default).
FLUSH_S = 3.0
CONTEXT_HEADERS = ("traceparent", "tracestate")


class Tracing:
    """Makes the spans; event-loop thread only."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._trace = trace
        self._provider = provider
        self._tracer = provider.get_tracer("batchserve", __version__)
        self._propagator = TraceContextTextMapPropagator()
        # Monotonic seconds (what requests and batches record) to wall-clock nanoseconds.
        self._offset_ns = time.time_ns() - time.monotonic_ns()

    @classmethod
    def configure(cls, endpoint: str | None, service_name: str = "batchserve") -> Tracing | None:
        """Tracing to ``endpoint`` (an OTLP/HTTP base URL), else to the OTEL_* environment's,
        else None (off). ConfigError if it is wanted but the ``otel`` extra is missing."""
        if endpoint is None and not any(os.environ.get(name) for name in OTLP_ENV):
            return None
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:
            raise ConfigError(
                "tracing is configured (otel_endpoint or OTEL_EXPORTER_OTLP_*ENDPOINT) but the "
                "otel extra is missing: pip install 'batchserve[otel]'"
            ) from None
        exporter = (OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")
                    if endpoint is not None else OTLPSpanExporter())
        resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME",
                                                                   service_name)})
        provider = TracerProvider(resource=resource, shutdown_on_exit=False)  # ``shutdown``
        provider.add_span_processor(BatchSpanProcessor(exporter))
        return cls(provider)

    def shutdown(self, within_s: float = FLUSH_S) -> bool:
        """Send what is buffered, then stop. Past ``within_s`` the rest is dropped, with a
        warning, and False: the flush goes on in a daemon thread, which the exit ends."""
        flush = threading.Thread(target=self._provider.shutdown, name="otel-flush", daemon=True)
        flush.start()
        flush.join(within_s)
        if flush.is_alive():
            log.warning("traces: the collector took none of the last spans within %g s; they "
                        "are dropped", within_s)
            return False
        return True

    def _ns(self, monotonic_s: float) -> int:
        return self._offset_ns + int(monotonic_s * 1e9)

    def start(self, name: str, carrier: Mapping[str, str], started: float,
              attributes: Mapping[str, Any]) -> Span:
        """A server span for one request or job, child of the caller's ``traceparent`` in
        ``carrier`` if it has a valid one."""
        context = self._propagator.extract(carrier)
        return self._tracer.start_span(name, context=context, kind=self._trace.SpanKind.SERVER,
                                       start_time=self._ns(started), attributes=attributes)

    def end(self, span: Span, status: int, ended: float) -> None:
        span.set_attribute("http.response.status_code", status)
        if status >= 500:
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR))
        span.end(end_time=self._ns(ended))

    def inject(self, span: Span) -> dict[str, str]:
        """The W3C headers that continue ``span`` elsewhere."""
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, self._trace.set_span_in_context(span))
        return carrier

    def batch(self, model: str, report: BatchReport) -> None:
        """The spans of one delivered batch: the batch's own, and each traced request's queue
        and device spans under its request span. Requests the sampler left out (the standard
        OTEL_TRACES_SAMPLER settings) or already answered (their deadline passed in the queue)
        get none, and a batch of only such requests no span."""
        requests = {id(item.request): item.request for item, _ in report.results
                    if item.request.trace is not None and item.request.trace.is_recording()
                    and not item.request.future.done()}
        if not requests:
            return
        start = report.started_at
        end = start + sum(report.compute_s)
        links = [self._trace.Link(r.trace.get_span_context()) for r in requests.values()]
        batch = self._tracer.start_span(
            "batch", start_time=self._ns(start), links=links, attributes={
                "batchserve.model": model, "batchserve.device": report.device,
                "batchserve.batch_size": sum(report.sizes) or len(report.results),
                "batchserve.compute_s": end - start,
            })
        batch.end(end_time=self._ns(end))
        batch_link = [self._trace.Link(batch.get_span_context())]
        for request in requests.values():
            parent = self._trace.set_span_in_context(request.trace)
            queue = self._tracer.start_span("queue", context=parent,
                                            start_time=self._ns(request.enqueued_at))
            queue.end(end_time=self._ns(start))
            device = self._tracer.start_span("device", context=parent, links=batch_link,
                                             start_time=self._ns(start),
                                             attributes={"batchserve.device": report.device})
            device.end(end_time=self._ns(end))


def carrier_of(headers: Mapping[bytes, bytes]) -> dict[str, str]:
    """The trace context headers of an ASGI request, as text."""
    return {name: value.decode("latin-1") for name in CONTEXT_HEADERS
            if (value := headers.get(name.encode())) is not None}
