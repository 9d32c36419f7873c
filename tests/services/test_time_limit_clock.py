"""DAYZERO_TASK_TIME_LIMIT_S on one clock, Redis's: a request's admission (the gateway's) and each
worker's checks of it are Redis's time as each process knows it (``redis_clock.now``: its own clock
plus its offset to Redis's, measured on its liveness stamps), so a worker on a host whose clock is
off the gateway's ends a request at its limit, not that much sooner or later. The skew is played by
the worker's process alone (its ``time.time`` moved), as in test_liveness_clock.py."""

from __future__ import annotations

import httpx

from dayzero.procs import free_port
from dayzero.stack import Stack

from .conftest import SETTINGS_ENV, chat
from .test_liveness_clock import skewed_worker


def test_a_decode_worker_whose_clock_is_ahead_runs_a_request_within_its_time_limit_to_its_end(text_dir, tmp_path):
    """The worker compared the gateway's admission time with its own clock: one on a host 60 s ahead
    took every request as a minute old, and with a 30 s limit ended each at its first decode step
    ("length", 6 tokens of 16). Now both are on Redis's clock: the request runs to its end."""
    env = {**SETTINGS_ENV, "DAYZERO_CHECKPOINT": str(text_dir), "DAYZERO_TASK_TIME_LIMIT_S": "30"}
    stack = Stack({"vision": 0, "prefill": 1, "decode": 0}, free_port(), tmp_path, env)
    stack.start()
    worker = skewed_worker(
        "decode", "decode0", 60.0, tmp_path / "decode0.log", {**env, "DAYZERO_REDIS_URL": stack.redis_url}
    )
    try:
        stack.wait_ready(timeout_s=180)
        body = chat("go on", max_tokens=16, ignore_eos=True)
        answer = httpx.post(f"{stack.url}/v1/chat/completions", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 16, answer.json()
    finally:
        worker.terminate()
        worker.wait(60)
        assert stack.stop() == []
