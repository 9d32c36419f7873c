"""A Redis outage wholly between two of the gateway's reaper passes: no pass failed, so none knew of
it. A worker that got ready during it, at a stage none served (its count running), had its readiness
stamp refused and stamps again within a retry of Redis's return; a pass before that stamp found the
stage past its bound, the outage in its count, and ended what waited there 503 ``no_worker``, the
worker ready. Now a stage first found past its bound ends nothing until a pass ``RESTAMPED_S`` later
finds it so too. A real Redis, a gateway in-process (a pass every 4 s: the outage fits between two),
the worker's liveness ``Pulse`` stamping when the test says (after that pass: the order of the race)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import redis
from fastapi.testclient import TestClient

from dayzero.serving import liveness
from dayzero.serving.keys import key
from dayzero.serving.liveness import Pulse, connect
from dayzero.settings import Settings
from services.gateway import reaping
from services.gateway.app import make_app

from .conftest import MODEL, wait_until
from .test_decode_appends import writes_refused

LEASE_S = 8.0  # a reaper pass every 4 s
BOUND_S = 1.0
BODY = {"model": MODEL, "prompt": [0, 5, 6], "max_tokens": 4}


def _read(client: redis.Redis) -> bool:
    """A request's stream has a reader (admitted, and its reader counted: a write refused after)."""
    return any(client.scan_iter(key("watchers", "*")))


def _counted(client: redis.Redis) -> float:
    """When a reaper pass last read prefill's stamps (Redis's time; 0: none has)."""
    return float(client.get(key("counted", "prefill")) or 0)


def test_an_outage_between_two_passes_ends_nothing_at_a_stage_whose_worker_got_ready_during_it(
    redis_url, demo_dir, monkeypatch
):
    monkeypatch.setattr(reaping, "RESTAMPED_S", 2.0)  # (the stamp below falls in it, whatever the load)
    client = redis.Redis.from_url(redis_url)
    client.flushdb()  # (another test's request or count)
    settings = Settings(redis_url=redis_url, checkpoint=demo_dir, lease_s=LEASE_S, no_worker_timeout_s=BOUND_S)
    worker = Pulse(connect(redis_url), "prefill")  # (started once the test lets it stamp)
    with TestClient(make_app(settings)) as gateway, ThreadPoolExecutor(1) as pool:
        assert wait_until(lambda: _counted(client), 15)  # a pass: prefill's count begins, under its bound
        counted = _counted(client)
        answer = pool.submit(gateway.post, "/v1/completions", json=BODY)
        assert wait_until(lambda: _read(client), 10)  # waiting at prefill, which none serves
        with writes_refused(client):  # (well before the next pass)
            worker.ready()  # refused: it stamps once Redis takes writes again
        assert _counted(client) == counted  # (no pass saw the outage)
        assert wait_until(lambda: _counted(client) > counted, 15)  # the next pass, before the worker's stamp
        worker.start()  # (its first stamp at once, ready)
        assert wait_until(lambda: client.hlen(key("ready", "prefill")), 10)
        stamped = _counted(client)
        assert wait_until(lambda: _counted(client) > stamped, 15)  # a pass that sees it
        assert not answer.done()  # (was: 503 no_worker at the pass before)
        worker.stop()  # none serves again: it ends at the bound from the worker's readiness
        ended = answer.result(timeout=30)
        assert ended.status_code == 503 and ended.json()["error"]["code"] == "no_worker"


def test_the_pass_after_a_long_refusal_wakes_a_worker_backing_off_before_it_looks_again(
    redis_url, demo_dir, monkeypatch
):
    """Its stamps refused past ``QUICK_RETRIES_S``, a worker retries once a stamp period, jittered
    (up to 1.5 s): the pass ``RESTAMPED_S`` after the first one that found its stage past the bound
    came before its stamp and ended what waited there. That first pass wakes it (here its wait is
    15-45 s: it stamps only if woken)."""
    monkeypatch.setattr(liveness, "QUICK_RETRIES_S", 0.0)
    monkeypatch.setattr(liveness, "STAMP_EVERY_S", 30.0)
    client = redis.Redis.from_url(redis_url)
    client.flushdb()  # (another test's request or count)
    settings = Settings(redis_url=redis_url, checkpoint=demo_dir, lease_s=0.4, no_worker_timeout_s=BOUND_S)
    worker = Pulse(connect(redis_url), "prefill")
    with TestClient(make_app(settings)) as gateway, ThreadPoolExecutor(1) as pool:
        answer = pool.submit(gateway.post, "/v1/completions", json=BODY)
        assert wait_until(lambda: _read(client), 10)  # waiting at prefill, which none serves
        assert wait_until(lambda: client.exists(key("unserved", "prefill")), 10)  # (its count runs)
        with writes_refused(client):
            worker.ready()  # refused
            worker.start()  # refused: backing off
            time.sleep(BOUND_S + 0.5)  # (its count past the bound)
            seconds, micros = client.time()
        back = seconds + micros / 1e6
        stamp = lambda: float(client.hget(key("alive", "prefill"), worker.process) or 0)  # noqa: E731
        assert wait_until(lambda: stamp() > back, 5)  # woken (was: 15-45 s on)
        stamped = _counted(client)
        assert wait_until(lambda: _counted(client) > stamped + 0.5, 10)  # passes that see it
        assert not answer.done()
        worker.stop()
        ended = answer.result(timeout=30)
        assert ended.status_code == 503 and ended.json()["error"]["code"] == "no_worker"
