"""Where the OTLP exporters send spans: DAYZERO_TRACE_ENDPOINT's forms, and the SDK's own variable."""

from __future__ import annotations

import os
import socket
import time

import pytest

from dayzero.settings import Settings
from dayzero.telemetry import collector_url, sdk_endpoint_checked, setup_tracing


@pytest.mark.parametrize(
    ("exporter", "endpoint", "url"),
    [
        ("otlp-http", "collector:4318", "http://collector:4318/v1/traces"),
        ("otlp-http", "10.0.0.5:9999/otlp/v1/traces", "http://10.0.0.5:9999/otlp/v1/traces"),
        ("otlp-http", "[::1]:4318", "http://[::1]:4318/v1/traces"),
        ("otlp-http", "collector", "http://collector:4318/v1/traces"),
        ("otlp-http", "https://collector:443", "https://collector:443/v1/traces"),
    ],
)
def test_a_host_and_port_without_a_scheme_is_that_host(exporter, endpoint, url):
    """``collector:4318`` went to the otlp-http exporter as it was, which failed every export ("No
    connection adapters were found for 'collector:4318'"): its spans were dropped."""
    assert collector_url(exporter, endpoint) == url


@pytest.mark.parametrize("insecure", [None, "true", "false"])
def test_a_host_and_port_reaches_the_grpc_exporter_as_it_reads_it(insecure, monkeypatch):
    """The gRPC exporter reads ``collector:4317`` as a TLS endpoint unless OTEL_EXPORTER_OTLP_INSECURE
    is true (OTLP's spec); an ``http://`` put before it made its channel plain text."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    if insecure is None:
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_INSECURE", raising=False)
    else:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", insecure)
    exporters = [OTLPSpanExporter(endpoint=e) for e in ("collector:4317", collector_url("otlp-grpc", "collector:4317"))]
    try:
        assert exporters[1]._insecure == exporters[0]._insecure
    finally:
        for exporter in exporters:
            exporter.shutdown()


@pytest.mark.parametrize("name", ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"])
def test_the_sdks_endpoint_without_a_scheme_is_refused_at_start(name, monkeypatch):
    """Where DAYZERO_TRACE_ENDPOINT is unset the SDK reads its own variable, and its otlp-http exporter
    took ``host:4318`` for a URL and dropped every span; gRPC's takes host:port (the spec asks for a URL)."""
    from dayzero import telemetry

    installed = []  # (the test process's own provider stays)
    monkeypatch.setattr(telemetry.trace, "set_tracer_provider", installed.append)
    monkeypatch.setenv(name, "collector:4318")
    with pytest.raises(ValueError, match=rf"^{name}='collector:4318' is no URL: .*http://host:port"):
        sdk_endpoint_checked(Settings(trace_exporter="otlp-http"), os.environ)  # (``dayzero serve``'s first step)
    monkeypatch.setenv(name, "http://collector:4318")
    sdk_endpoint_checked(Settings(trace_exporter="otlp-http"), os.environ)  # (a URL: taken)
    monkeypatch.setenv(name, "HTTP://collector:4318")
    sdk_endpoint_checked(Settings(trace_exporter="otlp-http"), os.environ)  # (a scheme has no case: taken, was refused)
    setup_tracing(Settings(trace_exporter="otlp-http"), "gateway")
    assert len(installed) == 1


def test_the_last_flush_waits_for_a_silent_collector_flush_within_s_at_most(monkeypatch):
    """``force_flush``'s timeout is not the BatchSpanProcessor's (SDK 1.45 drops it): a collector that
    accepts and never answers held a process's last flush for the exporter's own timeout (10 s by
    default, past FLUSH_WITHIN_S; 20 s here), past a stop's grace."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from dayzero import telemetry

    monkeypatch.setattr(telemetry, "FLUSH_WITHIN_S", 0.5)
    with socket.socket() as silent:  # (its backlog accepts the connection; nobody answers)
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{silent.getsockname()[1]}/v1/traces", timeout=20)
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=600_000))
        monkeypatch.setattr(telemetry.trace, "get_tracer_provider", lambda: provider)
        provider.get_tracer("test").start_span("batched").end()
        began = time.monotonic()
        telemetry.flush_spans()
        waited = time.monotonic() - began
    assert waited < 10, f"the flush waited {waited:.0f} s"


def test_a_process_ended_while_its_collector_is_silent_ends_within_flush_within_s(tmp_path):
    """``procs.end_process`` (a worker's stop) runs the exit handlers after the bounded flush: the SDK's
    own (TracerProvider.shutdown) waited on the export the flush left hanging, the exporter's timeout
    (20 s here) in all, past FLUSH_WITHIN_S."""
    import subprocess
    import sys

    with socket.socket() as silent:  # (its backlog accepts the connection; nobody answers)
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        ends = (
            "from opentelemetry import trace\n"
            "from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter\n"
            "from opentelemetry.sdk.trace import TracerProvider\n"
            "from opentelemetry.sdk.trace.export import BatchSpanProcessor\n"
            "from dayzero import procs, telemetry\n"
            "telemetry.FLUSH_WITHIN_S = 0.5\n"
            f"url = 'http://127.0.0.1:{silent.getsockname()[1]}/v1/traces'\n"
            "exporter = OTLPSpanExporter(endpoint=url, timeout=20)\n"
            "provider = TracerProvider()\n"
            "provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=600_000))\n"
            "trace.set_tracer_provider(provider)\n"
            "provider.get_tracer('test').start_span('batched').end()\n"
            "procs.end_process(0)\n"
        )
        script = tmp_path / "ends.py"
        script.write_text(ends)
        began = time.monotonic()
        ended = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
        waited = time.monotonic() - began
    assert ended.returncode == 0, ended.stderr
    assert waited < 10, f"the process took {waited:.0f} s to end"
