"""Tracing: one OpenTelemetry trace per request across the services.

Each process sets up a tracer provider from settings (off by default: the API's no-op
tracer). The request's context travels inside the stage messages as a W3C ``traceparent``
carrier (the loops run in their own threads, away from Celery's task context), and the
official FastAPI and Celery instrumentations add their server and task spans.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

from opentelemetry import context, propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor

from .settings import Settings

tracer = trace.get_tracer("dayzero")
OTLP_PORTS = {"otlp-grpc": 4317, "otlp-http": 4318}  # the protocol's standard ports (the collector's defaults)
_HOST_PORT = re.compile(r"(\[[\w:.]+\]|[\w.-]+):\d+(/.*)?")  # an endpoint without its scheme
FLUSH_WITHIN_S = (
    5.0  # a process's last flush waits this long at most (the SDK's default, 30 s, outlived a stop's grace)
)
SDK_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")  # (the first wins)


def setup_tracing(settings: Settings, service: str) -> None:
    """Install this process's tracer provider (``trace_exporter`` none: leave tracing off)."""
    if settings.trace_exporter == "none":
        return
    provider = TracerProvider(resource=Resource.create({"service.name": f"dayzero-{service}"}))
    if settings.trace_exporter == "console":
        path = settings.trace_file
        if path is not None and path.is_dir():  # one file per process
            path = path / f"{service}-{os.getpid()}.jsonl"
        out = open(path, "a", buffering=1) if path else None  # noqa: SIM115 - open for the process's life
        exporter = ConsoleSpanExporter(out=out, formatter=lambda span: json.dumps(json.loads(span.to_json())) + "\n")
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        if settings.trace_exporter == "otlp-http":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        endpoint = settings.trace_endpoint and collector_url(settings.trace_exporter, settings.trace_endpoint)
        exporter = OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


def collector_url(exporter: str, endpoint: str) -> str:
    """Where ``exporter`` (otlp-grpc, otlp-http) sends spans, from DAYZERO_TRACE_ENDPOINT: a host
    alone (docker-compose.yml's ``otel-collector``) is that host on the exporter's OTLP port, 4317 for
    gRPC, 4318 for HTTP (compose gave ``http://otel-collector:4317`` whatever the exporter, and
    otlp-http posted its spans to the gRPC port); ``host:port`` is ``http://host:port`` for otlp-http
    (which dropped every span), and left to the gRPC exporter, which reads it as TLS unless
    OTEL_EXPORTER_OTLP_INSECURE=true (an ``http://`` put before it sent the spans in plain text)."""
    if re.fullmatch(r"[\w.-]+", endpoint):
        endpoint = f"http://{endpoint}:{OTLP_PORTS[exporter]}"
    elif exporter == "otlp-http" and _HOST_PORT.fullmatch(endpoint):
        endpoint = f"http://{endpoint}"
    return otlp_http_traces_url(endpoint) if exporter == "otlp-http" else endpoint


def sdk_endpoint_checked(settings: Settings, environ: Mapping[str, str]) -> None:
    """A ValueError, at start, for the OpenTelemetry SDK's own endpoint variable (which otlp-http reads
    where DAYZERO_TRACE_ENDPOINT is unset) without http:// or https://: the spec asks for a URL, and the
    SDK's otlp-http exporter took ``host:4318`` for one, failing every export ("No connection
    adapters were found for 'host:4318/v1/traces'"), its spans dropped. ``dayzero serve`` asks, before
    any service starts (every process's ``setup_tracing`` runs under it): a worker's tracer is set up
    in Celery's worker_init, where it was a traceback and an exit 3."""
    if settings.trace_exporter != "otlp-http" or settings.trace_endpoint:
        return
    name = next((name for name in SDK_ENDPOINTS if environ.get(name)), None)
    if name is not None and not re.match(r"https?://", environ[name], re.IGNORECASE):  # (a scheme has no case)
        raise ValueError(
            f"{name}={environ[name]!r} is no URL: the otlp-http exporter sends to http://host:port (or https://); "
            "or set DAYZERO_TRACE_ENDPOINT, which also takes host:port"
        )


def otlp_http_traces_url(endpoint: str) -> str:
    """The URL spans are posted to at an OTLP/HTTP ``endpoint``: a collector's address without a path
    (``http://otel-collector:4318``) gets ``/v1/traces``, as the SDK adds it to OTEL_EXPORTER_OTLP_ENDPOINT.
    The exporter takes its ``endpoint`` as the whole URL: spans went to the collector's root, which
    answers 404, and were dropped."""
    url = urlsplit(endpoint)
    return urlunsplit(url._replace(path="/v1/traces")) if url.path in ("", "/") else endpoint


def flush_spans() -> None:
    """Export the spans still batched, waiting ``FLUSH_WITHIN_S`` at most for the collector. A process's
    last act before an exit that runs no exit handlers (where the SDK would flush them): uvicorn ends
    its process with the SIGTERM it caught, and ``os._exit`` (a refusal of Redis's, a failed group)."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):  # (the batch processor drops force_flush's timeout: bounded here)
        flush = threading.Thread(target=provider.force_flush, name="span-flush", daemon=True)
        flush.start()
        flush.join(FLUSH_WITHIN_S)
        if flush.is_alive():  # (the SDK's exit handler, end_process runs it, waited on the same export: 10 s more)
            atexit.unregister(provider.shutdown)


def carrier() -> dict[str, str]:
    """The current span context as message headers."""
    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers


@contextmanager
def continued(headers: dict[str, str] | None) -> Iterator[None]:
    """Run the block inside the context carried by a message."""
    token = context.attach(propagate.extract(headers or {}))
    try:
        yield
    finally:
        context.detach(token)
