"""``/ready`` while Redis answers reads and refuses writes: every admission is a write, so the
gateway serves nothing. With too few replicas (``min-replicas-to-write``, a replica's READONLY) the
stamps still read fresh: 200 for their 3 s while every request was 503 ``queue_unavailable``, then
"no live worker" for as long as the refusal lasted (an operator looked at the workers); at the
memory limit (its reads in a transaction refused too) "redis unreachable". Now its reason says Redis
refuses writes, at once; and credentials refused are said so (not "unreachable"). Real processes:
Redis and a gateway (no worker: /ready's reason was theirs)."""

from __future__ import annotations

import httpx
import pytest
import redis

from .conftest import start_gateway_alone, wait_until
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


def test_ready_says_redis_refuses_the_gateways_credentials(gateway):
    """Redis's password set (or changed) under a running gateway: its new connections are refused,
    and /ready said "redis unreachable: Authentication required." of a Redis that answers."""
    r = redis.Redis.from_url(gateway.redis_url)
    r.config_set("requirepass", "changed")
    try:
        r.client_kill_filter(_type="normal", skipme=True)  # the gateway's connections: made again, refused
        answer = httpx.get(f"{gateway.url}/ready", timeout=10)
        assert answer.status_code == 503, answer.text
        assert answer.json()["reason"].startswith("redis refuses DAYZERO_REDIS_URL's credentials: "), answer.json()
    finally:
        r.config_set("requirepass", "")
    assert wait_until(lambda: "no live worker" in httpx.get(f"{gateway.url}/ready", timeout=10).json()["reason"], 10)


def test_ready_says_redis_refuses_the_gateways_user_a_command_not_its_credentials(gateway):
    """An ACL that takes the gateway's user but not a command /ready sends (SET): the credentials are
    good, so the reason says a command was refused and names the user (it said "credentials", and an
    operator changed a password that was right)."""
    r = redis.Redis.from_url(gateway.redis_url)
    r.acl_setuser("default", enabled=True, commands=["-set"])
    try:
        answer = httpx.get(f"{gateway.url}/ready", timeout=10)
        reason = answer.json()["reason"]
        assert answer.status_code == 503 and reason.startswith("redis refuses DAYZERO_REDIS_URL's user a command: "), (
            reason
        )
        assert "credentials" not in reason and "'default'" in reason and "'set'" in reason, reason
    finally:
        r.acl_setuser("default", enabled=True, commands=["+@all"])
    assert wait_until(lambda: "no live worker" in httpx.get(f"{gateway.url}/ready", timeout=10).json()["reason"], 10)
