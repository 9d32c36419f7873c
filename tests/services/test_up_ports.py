"""``dayzero up`` refuses a port in use at start, naming it, before any child starts: the gateway's,
or a worker's /metrics port (it crash-looped on "Address already in use" until up gave up)."""

from __future__ import annotations

import signal
import socket

import pytest

from dayzero.procs import consecutive_ports, free_port
from dayzero.stack import Stack

from .conftest import SETTINGS_ENV


def _refused_at_start(checkpoint, log_dir, port: int, monkeypatch, capsys, extra: dict | None = None) -> list[str]:
    """``dayzero up`` as up_process starts it, in this process (one of its own imports torch again), refused
    before any child starts (one spawned fails the test): its stderr's lines. Its signal handlers undone."""
    from dayzero import cli

    for name, value in {**SETTINGS_ENV, **(extra or {})}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(Stack, "_spawn", lambda self, child: pytest.fail(f"up started {child.name}"))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = cli.main(
            ["up", "--checkpoint", str(checkpoint), "--vision", "0", "--port", str(port), "--log-dir", str(log_dir)]
        )
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert code == 1
    return capsys.readouterr().err.strip().splitlines()


def test_a_port_in_use_is_refused_at_start_naming_the_port(text_dir, tmp_path, monkeypatch, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = _refused_at_start(text_dir, tmp_path, port, monkeypatch, capsys)
    assert err == [f"error: port {port} is already in use on 127.0.0.1; stop that process or pass --port"]
    assert not (tmp_path / "gateway.log").exists()  # nothing was started


def test_a_metrics_port_in_use_is_refused_at_start_naming_it(text_dir, tmp_path, monkeypatch, capsys):
    """A worker's /metrics port taken (P + 1 here): one line at start, not a worker crash-looping
    on "Address already in use" until up gives up."""
    metrics = consecutive_ports(2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", metrics + 1))
        taken.listen()
        err = _refused_at_start(
            text_dir, tmp_path, free_port(), monkeypatch, capsys, {"DAYZERO_METRICS_PORT": str(metrics)}
        )
    assert err == [
        f"error: port {metrics + 1} (DAYZERO_METRICS_PORT + 1, decode0's /metrics) is already in use; "
        "stop that process or choose another DAYZERO_METRICS_PORT"
    ]
    assert not (tmp_path / "gateway.log").exists()  # nothing was started
