"""An OTLP/HTTP collector on a thread, for the tests of span export."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


@contextmanager
def otlp_collector():
    """An OTLP/HTTP collector on a thread -> (its address, the names of the spans it received at
    ``/v1/traces``)."""
    names: list[str] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path != "/v1/traces":  # as the OpenTelemetry collector answers
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()
                return
            sent = ExportTraceServiceRequest.FromString(self.rfile.read(int(self.headers["content-length"])))
            names.extend(s.name for r in sent.resource_spans for scope in r.scope_spans for s in scope.spans)
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *_) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", names
    finally:
        server.shutdown()
