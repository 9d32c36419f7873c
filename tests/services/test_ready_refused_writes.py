"""``/ready`` while Redis answers reads and refuses writes: every admission is a write, so the
gateway serves nothing. With too few replicas (``min-replicas-to-write``, a replica's READONLY) the
stamps still read fresh: 200 for their 3 s while every request was 503 ``queue_unavailable``, then
"no live worker" for as long as the refusal lasted (an operator looked at the workers); at the
memory limit (its reads in a transaction refused too) "redis unreachable". Now its reason says Redis
refuses writes, at once. Real processes: Redis and a gateway (no worker: /ready's reason was theirs)."""

from __future__ import annotations

import httpx
import pytest
import redis

from .conftest import start_gateway_alone
from .test_decode_appends import writes_refused


@pytest.fixture(scope="module")
def gateway(text_dir, tmp_path_factory):
    gateway = start_gateway_alone(text_dir, tmp_path_factory.mktemp("logs"))
    yield gateway
    gateway.stop()


@pytest.mark.parametrize("setting", ["min-replicas-to-write", "maxmemory"], ids=["noreplicas", "maxmemory"])
def test_ready_says_redis_refuses_writes(gateway, setting):
    r = redis.Redis.from_url(gateway.redis_url)
    assert "no live worker" in httpx.get(f"{gateway.url}/ready", timeout=10).json()["reason"]
    with writes_refused(r, setting):
        answer = httpx.get(f"{gateway.url}/ready", timeout=10)
        assert answer.status_code == 503 and answer.json()["reason"].startswith("redis refuses writes: ")
    assert "no live worker" in httpx.get(f"{gateway.url}/ready", timeout=10).json()["reason"]
