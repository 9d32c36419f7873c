"""The no-worker count is one per stage, in Redis, kept by every gateway's reaper. A gateway whose
pass failed on Redis began every stage's count again at its next pass (no_worker_count.count_again), for
all the gateways: one that lost Redis alone (its network; here its Redis user disabled a while)
reset a count the others had kept running, and one whose passes failed now and then reset it each
time: what waited at a stage with no worker never ended as ``no_worker``. Now a count some gateway
made since that failure stays. Two real gateways in-process on a Redis of their own, no worker."""

from __future__ import annotations

import time

import redis
from fastapi.testclient import TestClient

from dayzero.procs import free_port, start_redis
from dayzero.serving.keys import key
from dayzero.settings import Settings
from services.gateway.app import make_app

from .conftest import wait_until

LEASE_S = 0.4  # a reaper pass every 0.2 s
PASSES_S = 1.0  # a few passes


def test_a_gateway_that_lost_redis_alone_keeps_the_count_the_others_kept(demo_dir, tmp_path):
    port = free_port()
    server = start_redis(port, tmp_path / "redis.log")
    try:
        client = redis.Redis(port=port)
        client.acl_setuser("lone", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"], commands=["+@all"])
        settings = {"checkpoint": demo_dir, "lease_s": LEASE_S}
        lone = Settings(redis_url=f"redis://lone:pw@127.0.0.1:{port}/0", **settings)
        other = Settings(redis_url=f"redis://127.0.0.1:{port}/0", **settings)
        with TestClient(make_app(lone)), TestClient(make_app(other)):
            assert wait_until(lambda: client.get(key("unserved", "decode")) is not None, 10)
            began = client.get(key("unserved", "decode"))
            client.acl_setuser("lone", enabled=False)
            client.client_kill_filter(user="lone")  # its passes fail; the other's go on counting
            time.sleep(PASSES_S)
            client.acl_setuser("lone", enabled=True)
            time.sleep(PASSES_S)  # its passes run again (the first: count_again)
            assert any(c["user"] == "lone" for c in client.client_list())
            assert client.get(key("unserved", "decode")) == began  # (was: begun again, by the lone one)
    finally:
        server.terminate()
        server.wait(10)
