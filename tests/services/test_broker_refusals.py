"""A consumer's queue declaration waits while Redis refuses writes for a while (its memory limit, a
replica), and fails on a refusal no wait ends. Real Redis, kombu's channel over dayzero's transport."""

from __future__ import annotations

import pytest
import redis
from kombu import Connection

from dayzero.serving import broker

from .test_decode_appends import writes_refused
from .test_replica_switch import demoted


def _channel(redis_url: str):
    return Connection(redis_url, transport=broker.Transport).channel()


def _consume_from(channel, queue: str) -> None:
    """What a Celery consumer declares at its start: its exchange (kombu's state), queue and binding."""
    channel.exchange_declare(queue, "direct")
    channel.queue_declare(queue)
    channel.queue_bind(queue, exchange=queue, routing_key=queue)


LIFTS = {  # a refusal -> how to lift it (at the declaration's first wait)
    writes_refused: lambda r: r.config_set("maxmemory", 0),
    demoted: lambda r: r.execute_command("REPLICAOF", "NO", "ONE"),
}


@pytest.mark.parametrize("refusing", list(LIFTS), ids=["oom", "replica"])
def test_a_declaration_redis_refuses_for_a_while_waits_for_it(redis_url, monkeypatch, refusing):
    r, waits = redis.Redis.from_url(redis_url), []
    monkeypatch.setattr(broker.time, "sleep", lambda _s: waits.append(1) or LIFTS[refusing](r))
    channel = _channel(redis_url)
    try:
        with refusing(r):
            _consume_from(channel, "refused-a-while")
        assert waits  # it waited, then declared
        assert r.smembers("_kombu.binding.refused-a-while")
    finally:
        channel.close()


def test_a_declaration_redis_refuses_for_good_fails_at_once(redis_url, monkeypatch):
    """The binding's key holds another type (WRONGTYPE; so would an ACL user's NOPERM): no wait ends
    it. It waited for ever, its one line saying Redis refuses writes; now Celery is told at once."""
    r = redis.Redis.from_url(redis_url)
    r.set("_kombu.binding.refused-for-good", "not a set")

    def waited(_s: float) -> None:
        raise AssertionError("waited for a refusal no wait ends")

    monkeypatch.setattr(broker.time, "sleep", waited)
    channel = _channel(redis_url)
    try:
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            _consume_from(channel, "refused-for-good")
    finally:
        channel.close()
        r.delete("_kombu.binding.refused-for-good")
