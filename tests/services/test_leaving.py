"""Clients leaving requests and coming back, with Redis slow or gone at the moment it matters: the
gateway's pending cancels (services/gateway/leaving.py), against a real Redis and a real gateway."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from dayzero.serving.keys import key
from dayzero.serving.queue import make_celery
from dayzero.serving.watching import cancel_left
from dayzero.settings import Settings
from services.gateway.bus import Bus

from .conftest import MODEL, start_gateway_alone, wait_until

GRACE_S = 1.0
COMMANDS_S = 5.0  # the gateway's Redis commands' bound (DAYZERO_GATEWAY_REDIS_TIMEOUT_S)
BODY = {"model": MODEL, "prompt": [0, 5, 6], "max_tokens": 50, "stream": True}


def test_a_request_abandoned_twice_within_the_grace_is_left_to_redis_at_close(redis_url):
    """A resumed stream abandoned again: the gateway stopping leaves its request's cancel to Redis, due
    at the second read's grace's end (the first's was superseded by the resume), once; a running
    gateway's reaper pass (``cancel_left``) cancels it then, not before."""

    async def run() -> tuple[float | None, bool]:
        settings = Settings(redis_url=redis_url, disconnect_grace_s=60)
        bus = Bus(settings, make_celery(settings))
        for watcher in ("first", "resumed"):
            bus.leaving.reading("r1")
            await bus.watching.watch("r1", watcher)
            bus.leaving.leave("r1", watcher, time.time(), finished=False)
        await asyncio.sleep(0.2)  # both unwatched: their graces run
        await asyncio.wait_for(bus.close(), 5)
        client = aioredis.Redis.from_url(redis_url)
        due, cancelled = await client.zscore(key("left"), "r1"), bool(await client.exists(key("cancel", "r1")))
        await client.aclose()
        return due, cancelled

    due, cancelled = asyncio.run(run())
    assert due is not None and 58 < due - time.time() <= 60 and not cancelled
    client = redis.Redis.from_url(redis_url)
    assert cancel_left(client, 60) == [] and not client.exists(key("cancel", "r1"))  # not due yet
    client.zadd(key("left"), {"r1": time.time() - 1})  # (its grace's end, passed)
    assert cancel_left(client, 60) == ["r1"] and client.exists(key("cancel", "r1"))
    assert client.zcard(key("left")) == 0


def test_a_resume_of_a_request_left_to_redis_takes_its_cancel_back(redis_url):
    """A stopped gateway left a request's cancel to Redis; its client resumes it on another gateway and
    leaves again there, within that read's grace when the first is due: the resume took the left
    cancel back (that gateway's own leave decides), the reaper's pass cancels nothing. (The entry
    stayed: the request was cancelled within its client's grace on the second gateway.)"""

    async def run() -> None:
        settings = Settings(redis_url=redis_url, disconnect_grace_s=60)
        bus = Bus(settings, make_celery(settings))
        await bus.watching.cancel_later("r9", time.time() + 0.5)  # the stopped gateway's
        bus.leaving.reading("r9")
        await bus.watching.watch("r9", "resumed")  # resumed here
        bus.leaving.leave("r9", "resumed", time.time(), finished=False)  # and left again: its grace runs
        await asyncio.sleep(1.0)  # the stopped gateway's grace has ended
        client = redis.Redis.from_url(redis_url)
        assert cancel_left(client, 60) == [] and not client.exists(key("cancel", "r9"))
        client.close()
        await asyncio.wait_for(bus.close(), 5)  # this one stops too: its own grace, left to Redis

    asyncio.run(run())
    client = redis.Redis.from_url(redis_url)
    assert 55 < client.zscore(key("left"), "r9") - time.time() <= 60 and not client.exists(key("cancel", "r9"))


def test_a_resume_on_its_way_holds_the_cancel_of_another_read_that_left(redis_url):
    """Two resumes of a request reach the gateway; the first reads and leaves while the second is
    still on its way (its route waits on a slow Redis): the second's arrival holds the first's cancel
    past the grace until it reads. (The first's start took every arrival with it: the request was
    cancelled under the second, about to watch.)"""

    async def run() -> tuple[bool, bool]:
        settings = Settings(redis_url=redis_url, disconnect_grace_s=0.2)
        bus = Bus(settings, make_celery(settings))
        client, cancel = aioredis.Redis.from_url(redis_url), key("cancel", "r2")
        with bus.leaving.coming("r2"):  # the second resume, on its way
            with bus.leaving.coming("r2"):  # the first one
                pass
            bus.leaving.reading("r2")
            await bus.watching.watch("r2", "first")
            bus.leaving.leave("r2", "first", time.time(), finished=False)
            await asyncio.sleep(1.0)  # past the first's grace
            held = not await client.exists(cancel)
        bus.leaving.reading("r2")
        await bus.watching.watch("r2", "second")
        await asyncio.wait_for(bus.close(), 5)
        kept = not await client.exists(cancel)
        await client.aclose()
        return held, kept

    assert asyncio.run(run()) == (True, True)


@pytest.fixture(scope="module")
def gateway(text_dir, tmp_path_factory):
    """A gateway alone (nothing takes its requests: they wait, unread, until cancelled; a cancel Redis
    refused goes at once: no other gateway runs on its Redis, the delay's own tests are in
    test_leaving_refused.py). Its commands give up on a frozen Redis after COMMANDS_S, not 10 s
    (still well past the stalls its tests want ridden out: 1.7 s)."""
    extra = {"DAYZERO_DISCONNECT_GRACE_S": str(GRACE_S), "DAYZERO_NO_WORKER_TIMEOUT_S": "600"}
    extra |= {"DAYZERO_GATEWAY_REDIS_TIMEOUT_S": str(COMMANDS_S)}
    stack = start_gateway_alone(text_dir, tmp_path_factory.mktemp("logs"), extra)
    yield stack
    stack.stop()


def _left_stream(stack) -> tuple[str, str]:
    """A stream opened, read by its client, then left: its grace runs. -> its id, its resume token."""
    r = redis.Redis.from_url(stack.redis_url)
    with httpx.stream("POST", f"{stack.url}/v1/completions", json=BODY, timeout=30) as response:
        assert response.status_code == 200, response.read()
        rid, token = response.headers["x-request-id"], response.headers["x-resume-token"]
        assert wait_until(lambda: r.exists(key("watchers", rid)), 10)
    assert wait_until(lambda: not r.exists(key("watchers", rid)), 10)
    return rid, token


def _redis_back(stack) -> None:
    """The killed Redis started again on its port: the module's gateway keeps one Redis whose kills come
    within a minute of its start, and from the second such exit up waits before the next start (1 s,
    doubled), which ``until_ready`` waits out."""
    assert stack.supervise() == ["redis"]
    stack.until_ready("redis", 70)


class Resumed(threading.Thread):
    """A client reading a stream again by its id, until told to stop (at its next line)."""

    def __init__(self, stack, rid: str, token: str) -> None:
        super().__init__(daemon=True)
        self.url, self.headers = f"{stack.url}/v1/requests/{rid}/stream", {"X-Resume-Token": token}
        self.status, self.reading, self.stop = None, threading.Event(), threading.Event()

    def run(self) -> None:
        with httpx.stream("GET", self.url, headers=self.headers, timeout=60) as response:
            self.status = response.status_code
            for _ in response.iter_lines():
                self.reading.set()
                if self.stop.is_set():
                    return

    def leave(self) -> None:
        self.stop.set()
        self.join(30)


def test_a_stream_resumed_within_the_grace_is_not_cancelled_by_a_redis_stall(gateway):
    """The client comes back within the grace while Redis is stopped, and Redis answers again only
    after the grace: the resume wins (the grace's cancel, its three commands queued behind the stall
    beside the resume's four, was set under the resumed reader). Once the resumed reader leaves too,
    its own grace cancels the request."""
    rid, token = _left_stream(gateway)
    r, client = redis.Redis.from_url(gateway.redis_url), Resumed(gateway, rid, token)
    gateway.redis.send_signal(signal.SIGSTOP)
    try:
        time.sleep(GRACE_S / 5)
        client.start()  # within the grace
        time.sleep(1.5 * GRACE_S)  # the grace ends while Redis is stopped
    finally:
        gateway.redis.send_signal(signal.SIGCONT)
    try:
        assert wait_until(lambda: r.exists(key("watchers", rid)), 15) and client.reading.wait(15)
        assert not wait_until(lambda: r.exists(key("cancel", rid)), 2 * GRACE_S + 1)
    finally:
        client.leave()
    assert wait_until(lambda: r.exists(key("cancel", rid)), 10 * GRACE_S)


def test_a_resume_redis_failed_starts_the_grace_again(gateway):
    """The client comes back within the grace, but Redis, frozen past the commands' bound, fails its
    resume (503): the grace starts again from there, so its retry once Redis answers reads on."""
    rid, token = _left_stream(gateway)
    r, first = redis.Redis.from_url(gateway.redis_url), Resumed(gateway, rid, token)
    gateway.redis.send_signal(signal.SIGSTOP)
    try:
        first.start()
        first.join(30)
    finally:
        gateway.redis.send_signal(signal.SIGCONT)
    again = Resumed(gateway, rid, token)
    again.start()
    try:
        assert first.status == 503 and again.reading.wait(15)
        assert not wait_until(lambda: r.exists(key("cancel", rid)), 2 * GRACE_S + 1)
    finally:
        again.leave()


def test_a_cancel_redis_failed_goes_through_once_it_is_back(gateway):
    """Redis is down as the grace's cancel fires: the cancel is tried again until Redis answers (it
    was lost, its exception never retrieved, and the request generated to its end), once in the log."""
    rid, _ = _left_stream(gateway)
    gateway.redis.kill()
    gateway.redis.wait()
    time.sleep(1.5 * GRACE_S)  # the grace ends while Redis is down
    _redis_back(gateway)  # on its port (empty: the cancel is all there is)
    r = redis.Redis.from_url(gateway.redis_url)
    assert wait_until(lambda: r.exists(key("cancel", rid)), 30)
    log = (gateway.log_dir / "gateway.log").read_text()
    assert "never retrieved" not in log and log.count(f"request {rid}: its cancel failed") == 1


def test_a_client_that_leaves_while_redis_is_frozen_has_its_request_cancelled(gateway):
    """The client leaves while Redis is frozen past the commands' bound (COMMANDS_S): its read's unwatch
    fails, and was dropped (the request kept a reader for good: never cancelled, generated to its end);
    it is tried again once Redis answers, and the grace's cancel follows."""
    r = redis.Redis.from_url(gateway.redis_url)
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json=BODY, timeout=30) as response:
        assert response.status_code == 200, response.read()
        rid = response.headers["x-request-id"]
        assert wait_until(lambda: r.exists(key("watchers", rid)), 10)
        gateway.redis.send_signal(signal.SIGSTOP)
    try:
        time.sleep(COMMANDS_S + 2)  # the unwatch gives up on the frozen Redis after COMMANDS_S
    finally:
        gateway.redis.send_signal(signal.SIGCONT)
    assert wait_until(lambda: r.exists(key("cancel", rid)), 30)


def test_resumes_redis_refuses_through_an_outage_log_their_request_once(gateway):
    """A client resumes its stream again and again while Redis is down (each answered 503): each
    refused resume's leave is tried again until Redis answers, and the request's log says so once,
    and once when it goes through (was: two lines per resume, for every try of every client)."""
    rid, token = _left_stream(gateway)
    gateway.redis.kill()
    gateway.redis.wait()
    url, headers = f"{gateway.url}/v1/requests/{rid}/stream", {"X-Resume-Token": token}
    assert [httpx.get(url, headers=headers, timeout=30).status_code for _ in range(4)] == [503] * 4
    _redis_back(gateway)
    log = gateway.log_dir / "gateway.log"
    assert wait_until(lambda: f"request {rid}: its unwatch went through" in log.read_text(), 30)  # (the last one's)
    text = log.read_text()
    assert text.count(f"request {rid}: its unwatch failed") == 1
    assert text.count(f"request {rid}: its unwatch went through") == 1
