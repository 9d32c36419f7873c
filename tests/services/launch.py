"""``dayzero up`` started as a user starts it, for the supervision and chaos tests; a long stream in flight."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time

import httpx

from .conftest import MODEL, SETTINGS_ENV

LONG_STREAM = {"model": MODEL, "prompt": [0, 5, 6], "max_tokens": 2000, "ignore_eos": True, "stream": True}


def up_process(
    checkpoint, log_dir, port: int, counts: str = "--vision 0", extra: dict | None = None, **popen
) -> subprocess.Popen:
    """``dayzero up`` (gateway, 1 prefill, 1 decode unless ``counts``; ``extra`` settings) as a user
    starts it, in the background."""
    cmd = [sys.executable, "-m", "dayzero.cli", "up", "--checkpoint", str(checkpoint), *counts.split()]
    cmd += ["--port", str(port), "--log-dir", str(log_dir)]
    env = {**os.environ, **SETTINGS_ENV, **(extra or {})}
    return subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, **popen)


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 180) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline and proc.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        time.sleep(0.3)
    said = proc.stderr.read()[-3000:] if proc.poll() is not None and proc.stderr else ""
    raise AssertionError(f"not ready (exit code {proc.poll()})\n{said}")


def stream_in_flight(url: str, timeout_s: float = 300) -> threading.Event:
    """A long stream (``LONG_STREAM``), read on a thread to its end or its error (a decode worker
    holds it while Redis goes). -> set once its tokens arrive."""
    decoding = threading.Event()

    def read() -> None:
        try:
            with httpx.stream("POST", f"{url}/v1/completions", json=LONG_STREAM, timeout=timeout_s) as response:
                for i, _ in enumerate(response.iter_lines()):
                    if i == 10:
                        decoding.set()
        except httpx.HTTPError:
            pass

    threading.Thread(target=read, daemon=True).start()
    return decoding
