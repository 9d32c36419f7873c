"""A stopping gateway leaves the gateways on its Redis (``dz:gateways``: dayzero.serving.gateways) for
good. Its reaper stamps it there in a thread (at its start, and at the end of each pass), and the
lifespan's end cancelled the reaper without waiting for that thread: a stamp in flight landed after
the leave, and the stopped gateway counted as running for ``GONE_MIN_S`` (15 s), while another
gateway deferred the cancels Redis refused for a resume it could never take. Real Redis; the
gateway's app in-process, its stamps slowed (a loaded host, a slow Redis)."""

from __future__ import annotations

import threading
import time

import redis
from fastapi.testclient import TestClient

from dayzero.serving.keys import key
from dayzero.settings import Settings
from services.gateway import reaping
from services.gateway.app import make_app

SLOW_S = 1.0  # each stamp's round trip here


def test_a_gateway_stopping_while_its_start_stamp_is_in_flight_leaves_for_good(demo_dir, redis_url, monkeypatch):
    stamping, stamp = threading.Event(), reaping.stamp

    def slow_stamp(*args) -> None:
        stamping.set()
        time.sleep(SLOW_S)
        stamp(*args)

    monkeypatch.setattr(reaping, "stamp", slow_stamp)
    client = redis.Redis.from_url(redis_url)
    with TestClient(make_app(Settings(checkpoint=demo_dir, redis_url=redis_url))) as gateway:
        assert stamping.wait(30), "the reaper never stamped"
        name = gateway.app.state.gateway.bus.gateway
    time.sleep(2 * SLOW_S)  # (a stamp still in flight has landed by now)
    assert client.zscore(key("gateways"), name) is None


def test_a_stopping_gateway_ends_its_streams_while_the_reapers_stamp_is_in_flight(demo_dir, redis_url, monkeypatch):
    """Only the leave waits for the reaper's stamp: the streams' close (the bus's hub) came after that wait,
    and a stop on a frozen Redis took the wait (``REAPER_END_S``) longer: 11.3 -> 15.4 s (bench in the
    commit). Here the hub's close begins while the slowed start stamp is still in flight."""
    stamping, stamped, stamp = threading.Event(), threading.Event(), reaping.stamp
    closing_in_flight = []

    def slow_stamp(*args) -> None:
        stamping.set()
        time.sleep(SLOW_S)
        stamp(*args)
        stamped.set()

    monkeypatch.setattr(reaping, "stamp", slow_stamp)
    with TestClient(make_app(Settings(checkpoint=demo_dir, redis_url=redis_url))) as gateway:
        assert stamping.wait(30), "the reaper never stamped"
        hub = gateway.app.state.gateway.bus.hub
        close = hub.close

        async def noted_close(*args, **kwargs):
            closing_in_flight.append(not stamped.is_set())
            return await close(*args, **kwargs)

        monkeypatch.setattr(hub, "close", noted_close)
        name = gateway.app.state.gateway.bus.gateway
    assert closing_in_flight == [True], "the streams' close waited for the reaper's stamp"
    assert stamped.is_set() and redis.Redis.from_url(redis_url).zscore(key("gateways"), name) is None
