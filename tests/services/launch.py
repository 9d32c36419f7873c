"""``dayzero up`` started as a user starts it, for the supervision and chaos tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import httpx

from .conftest import SETTINGS_ENV


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
