"""A worker's consumer tries its broker connection again a second apart at most while Redis is out,
and consumes once it is back (was: kombu's default intervals, 2, 4, 6, ... up to 30 s apart: a worker
took work again up to 12 s after Redis was back from a 30 s outage, up to 30 s after a longer one).
It tries for as long as Redis is out (was: 100 tries, then "Unrecoverable error"). Real Redis (killed,
then started again on its port), a real Celery worker process on dayzero's app
(tests/services/reconnecting.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from dayzero.procs import free_port, start_redis

from .conftest import stopped, wait_until
from .reconnecting import QUEUE, touching_app

ROOT = Path(__file__).resolve().parents[2]
OUTAGE_S = 5.0  # kombu's default tries in it: at 0, 2 and 6 s (waits of 2 and 4 s)
# Celery's line at each try: "... Trying again in 1.00 second... (3/None)" ("now": under a second)
TRIED = re.compile(r"Trying again (now|in ([\d.]+) seconds?)\.\.\. \((\d+)/(\w+)\)")


def test_a_worker_tries_again_each_second_while_redis_is_out_and_consumes_once_it_is_back(tmp_path):
    port, log, mark = free_port(), tmp_path / "worker.log", tmp_path / "touched"
    url = f"redis://127.0.0.1:{port}/0"
    server = start_redis(port, tmp_path / "redis.log")
    cmd = [sys.executable, "-m", "tests.services.reconnecting", url]
    worker = subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        assert wait_until(lambda: "ready." in log.read_text(), 60), log.read_text()
        server.kill()
        server.wait()
        assert wait_until(lambda: "Connection to broker lost" in log.read_text(), 30), log.read_text()
        time.sleep(OUTAGE_S)
        server = start_redis(port, tmp_path / "redis.log")
        touching_app(url).send_task("touch", args=[str(mark)], queue=QUEUE)
        assert wait_until(mark.exists, 60), log.read_text()[-3000:]  # it consumes again
    finally:
        stopped(worker)
        stopped(server)
    tries = TRIED.findall(log.read_text())
    waits = [float(seconds or 0) for _, seconds, _, _ in tries]
    assert len(tries) >= 4 and max(waits) <= 1.0, waits  # was: [2.0, 4.0] (a try at 0, 2, 6 s)
    assert {limit for _, _, _, limit in tries} == {"None"}  # no limit (was: 100)
    assert "Unrecoverable error" not in log.read_text()


def _password_changed(r: redis.Redis) -> None:
    r.config_set("requirepass", "changed")


def _ping_taken_away(r: redis.Redis) -> None:
    r.acl_setuser("default", enabled=True, nopass=True, keys=["*"], channels=["*"], commands=["+@all", "-ping"])


@pytest.mark.parametrize(
    ("refusal", "said"),
    [(_password_changed, "Authentication required"), (_ping_taken_away, "no permissions to run the 'ping' command")],
)
def test_a_worker_whose_redis_refuses_its_credentials_past_the_bound_exits_3(refusal, said, tmp_path):
    """Redis's password changed under a running worker (its connections then closed): no try mends it.
    The consumer tried for ever (a line each 10 s), the worker alive and taking no work; after
    DAYZERO_CREDENTIALS_REFUSED_S of refusals it says so and exits 3, for its supervisor to start it
    again with its current settings. So too where its user's ACL takes PING away (it tried for ever)."""
    port, log = free_port(), tmp_path / "worker.log"
    url = f"redis://127.0.0.1:{port}/0"
    server = start_redis(port, tmp_path / "redis.log")
    cmd = [sys.executable, "-m", "tests.services.reconnecting", url]
    env = {**os.environ, "DAYZERO_CREDENTIALS_REFUSED_S": "3"}
    worker = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        assert wait_until(lambda: "ready." in log.read_text(), 60), log.read_text()
        r = redis.Redis(port=port)
        refusal(r)
        for kind in ("normal", "pubsub"):  # (the worker's connections: its consumer's, its remote control's)
            r.client_kill_filter(_type=kind, skipme=True)
        assert worker.wait(60) == 3, log.read_text()[-3000:]
    finally:
        stopped(worker)
        stopped(server)
    line = re.search(r"Redis has refused this worker's credentials for (\d+) s \((.*)\): exiting 3", log.read_text())
    assert line and int(line[1]) >= 3 and said in line[2], log.read_text()[-3000:]
