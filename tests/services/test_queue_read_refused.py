"""A consumer's queue read (BRPOP pops: a write) while Redis refuses writes for a while (too few
replicas: ``min-replicas-to-write``): kombu raised it as a channel error and Celery ended the worker
("Unrecoverable error": every prefill and decode worker at once, in a 25 s refusal); now it is a lost
connection, which Celery reconnects from (its declaration then waits for writes: test_broker_refusals).
Real Redis, kombu's channel over dayzero's transport."""

from __future__ import annotations

import pytest
import redis
from kombu import Connection, Exchange, Queue

from dayzero.serving import broker

from .test_decode_appends import writes_refused


def test_a_queue_read_redis_refuses_for_a_while_is_a_lost_connection(redis_url):
    r, queue = redis.Redis.from_url(redis_url), Queue("refused-read", Exchange("refused-read"), "refused-read")
    with Connection(redis_url, transport=broker.Transport) as connection:
        consumer = connection.Consumer(queue, callbacks=[lambda *_: None])  # (declared while Redis takes writes)
        consumer.consume()
        with writes_refused(r, "min-replicas-to-write"), pytest.raises(redis.ConnectionError, match="NOREPLICAS"):
            connection.drain_events(timeout=2)  # the consumer's blocked read, as Celery's loop sends it (was: a
            # ResponseError)
