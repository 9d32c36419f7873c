"""`dayzero up` stopped by SIGINT before its stack starts, as a background job (`dayzero up &`,
which inherits SIGINT ignored) is stopped."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time

import pytest


def _writer_once_read(fifo, process: subprocess.Popen, within: float) -> int:
    """The FIFO's write end, opened once ``process`` opened it to read (it then waits in its read)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and process.poll() is None:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # (no reader yet)
                raise
            time.sleep(0.05)
    pytest.fail(f"up never read its config.json: {process.communicate(timeout=5)}")


def test_sigint_to_a_background_up_stops_it_during_its_checks(tmp_path):
    """Up handled SIGINT only once its checks passed (seconds under load: the config, the weights'
    headers, the pools, the tokenizer), so a background job ignored a SIGINT sent meanwhile and
    started the stack anyway. A config.json that is a FIFO holds `up` in that window."""
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    os.mkfifo(checkpoint / "config.json")
    argv = [sys.executable, "-m", "dayzero.cli", "up", "--checkpoint", str(checkpoint), "--log-dir", str(tmp_path)]
    up = subprocess.Popen(
        argv,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # as the shell starts `up &`
    )
    writer = _writer_once_read(checkpoint / "config.json", up, within=120)
    try:
        up.send_signal(signal.SIGINT)
        try:
            code = up.wait(timeout=20)
        except subprocess.TimeoutExpired:
            code = None
    finally:
        os.close(writer)  # (a read still waiting ends: the config is empty)
        up.kill()
        err = up.communicate(timeout=30)[1]
    assert (code, err) == (130, "\ninterrupted\n")
