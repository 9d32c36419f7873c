"""A Redis that Sentinel watches (``redis+sentinel://``): the whole stack on its master, the master
SIGKILLed, the sentinel's promotion of the replica, requests served again. Every client dayzero
builds asks the sentinel for the master (redis_clients.py); Celery's broker through kombu's
sentinel transport. Real processes: master, replica, sentinel, gateway, prefill and decode."""

from __future__ import annotations

import time

import httpx
import pytest
import redis

from dayzero.serving.liveness import stamps

from .conftest import MODEL, start_stack, stream_text, wait_until
from .sentinel_group import sentinel_group

SERVED_AGAIN_WITHIN_S = 60  # (a bound that tells a stack stuck on its dead master; the seconds are printed)


def _served(url: str) -> bool:
    body = {"model": MODEL, "prompt": [0, 5, 6], "max_tokens": 4, "ignore_eos": True}
    try:
        return httpx.post(f"{url}/v1/completions", json=body, timeout=20).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.slow
def test_requests_are_served_again_after_the_sentinel_promotes_the_replica(text_dir, tmp_path):
    (tmp_path / "redis").mkdir()
    with sentinel_group(tmp_path / "redis") as group:
        stack = start_stack(text_dir, tmp_path, {"vision": 0, "prefill": 1, "decode": 1}, redis_url=group.url())
        try:
            assert _served(stack.url)
            group.procs["master"].kill()
            killed, replica = time.monotonic(), redis.Redis(port=group.replica_port)
            killed_at = float("{}.{:06d}".format(*replica.time()))  # (Redis's clock, the stamps' own)
            while not _served(stack.url) and time.monotonic() - killed < SERVED_AGAIN_WITHIN_S:
                time.sleep(0.2)
            served_after_s = time.monotonic() - killed
            print(f"first 200 {served_after_s:.1f} s after the master's SIGKILL")
            assert served_after_s < SERVED_AGAIN_WITHIN_S
            assert group.master_says() == group.replica_port  # (the promotion happened)
            for stage in ("prefill", "decode"):  # the workers' liveness stamps reach the new master
                assert wait_until(lambda s=stage: max(stamps(replica, s).values(), default=0) > killed_at, 10)
            body = {"model": MODEL, "prompt": [0, 7], "max_tokens": 8, "ignore_eos": True, "stream": True}
            # a stream too: the tokens' Redis stream on the new master
            text, _, final, _ = stream_text(f"{stack.url}/v1/completions", body)
            assert text and final["choices"][0]["finish_reason"] == "length"
        finally:
            stack.stop()
