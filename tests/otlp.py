"""An OTLP/HTTP trace receiver for tests (and bench/tracing.py): decodes what an exporter sends
with opentelemetry-proto, or only counts it."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


class Receiver:
    """An OTLP/HTTP trace receiver on a free loopback port: every span it was sent (with
    ``decode`` False, only how many requests and bytes: a sink that costs its host little)."""

    def __init__(self, decode: bool = True) -> None:
        self.spans: list[Any] = []
        self.paths: list[str] = []
        self.requests = self.bytes = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server interface
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests += 1
                receiver.bytes += len(body)
                receiver.paths.append(self.path)
                if decode:
                    if self.headers.get("Content-Encoding") == "gzip":
                        body = gzip.decompress(body)
                    request = ExportTraceServiceRequest.FromString(body)
                    receiver.spans += [span for resource in request.resource_spans
                                       for scope in resource.scope_spans for span in scope.spans]
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def named(self, name: str) -> list[Any]:
        return [s for s in self.spans if s.name == name]


@contextmanager
def receiving(decode: bool = True) -> Iterator[Receiver]:
    receiver = Receiver(decode)
    thread = threading.Thread(target=receiver.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()


def attributes(span: Any) -> dict[str, Any]:
    return {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}
