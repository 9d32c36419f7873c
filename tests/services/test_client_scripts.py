"""The reaper's script calls that take a client register their scripts once per client
(``client_scripts.registered``), not on every call; the scripts still run after Redis lost them
(SCRIPT FLUSH: redis-py loads one again on its NOSCRIPT), and a client dropped is not kept. Real Redis."""

from __future__ import annotations

import gc
import time
import weakref

import redis

from dayzero.serving.client_scripts import registered
from dayzero.serving.keys import key
from dayzero.serving.no_worker_count import COUNT, COUNT_AGAIN, count_again, unserved_for
from dayzero.serving.watching import CANCEL_DUE, cancel_left


def test_a_script_is_registered_once_per_client():
    one, other = redis.Redis(), redis.Redis()  # (no connection yet: registering sends nothing)
    assert registered(one, COUNT) is registered(one, COUNT)
    assert registered(one, COUNT) is not registered(other, COUNT) and registered(one, COUNT_AGAIN).sha != (
        registered(one, COUNT).sha
    )


def test_the_reapers_scripts_run_on_after_redis_lost_them(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.delete(*(key(family, "flushed") for family in ("alive", "ready", "unserved", "restart", "counted")))
    began = client.time()[0]
    assert unserved_for(client, "flushed") < 1.0  # no process: the count begins
    client.zadd(key("left"), {"due-1": time.time() - 1})
    assert cancel_left(client, 60) == ["due-1"]
    scripts = [registered(client, script) for script in (COUNT, COUNT_AGAIN, CANCEL_DUE)]
    client.script_flush()
    assert not any(client.script_exists(*[script.sha for script in scripts]))
    assert unserved_for(client, "flushed") >= 0.0 and float(client.get(key("unserved", "flushed"))) >= began
    client.zadd(key("left"), {"due-2": time.time() - 1})
    assert cancel_left(client, 60) == ["due-2"] and client.exists(key("cancel", "due-2"))
    counted = client.get(key("unserved", "flushed"))
    count_again(client, ("flushed",), failed_at=time.time() + 60)  # no process served it: the count is kept
    assert client.get(key("unserved", "flushed")) == counted
    assert [registered(client, script) for script in (COUNT, COUNT_AGAIN, CANCEL_DUE)] == scripts  # the same ones
    assert all(client.script_exists(*[script.sha for script in scripts]))  # loaded again


def test_a_dropped_client_is_not_kept_by_its_scripts(redis_url):
    client = redis.Redis.from_url(redis_url)
    unserved_for(client, "dropped")
    dropped = weakref.ref(client)
    del client
    gc.collect()
    assert dropped() is None  # (kept, its connection stayed open as long as the process)
