"""kombu refreshes its expiring queues' bindings (Celery's remote control queue, ``x-expires``) with a
script, tried again each second until it goes through. A Redis at its memory limit refuses scripts
while the queue read goes on: kombu logged a warning with its traceback at each try (a second apart,
for as long as the refusal lasts). Now the first refusal is a line, the rest are counted (a line per
period), and a line says when a refresh goes through again. Real Redis; kombu's consumer over
dayzero's transport."""

from __future__ import annotations

import contextlib
import logging

import redis
from kombu import Connection, Exchange, Queue

from dayzero.serving import broker

from .test_decode_appends import writes_refused

TRIES = 5


def _drained(connection: Connection) -> None:
    """One pass of the consumer's read (kombu refreshes the bindings first, when due)."""
    with contextlib.suppress(TimeoutError):
        connection.drain_events(timeout=0.05)


def test_refused_refreshes_of_expiring_bindings_are_a_line_and_a_count_not_a_traceback_each(redis_url, caplog):
    r, queue = redis.Redis.from_url(redis_url), Queue("expiring", Exchange("expiring"), "expiring", expires=10)
    with Connection(redis_url, transport=broker.Transport) as connection:
        connection.Consumer(queue, callbacks=[lambda *_: None]).consume()
        _drained(connection)  # (refreshed: not due again for a while)
        with caplog.at_level(logging.WARNING), writes_refused(r):
            connection.default_channel._binding_expiry_refreshed_at = float("-inf")  # (due now)
            for _ in range(TRIES):
                _drained(connection)  # (refused: due again at the next)
            refused = [rec for rec in caplog.records if rec.levelno >= logging.WARNING]
        _drained(connection)
        back = [rec.getMessage() for rec in caplog.records if rec not in refused]
    said = [rec.getMessage() for rec in refused]
    assert len(said) == 1 and not any(rec.exc_info for rec in refused), said  # was: 5, each with its traceback
    assert "Redis refuses kombu's refresh of its expiring bindings" in said[0] and "maxmemory" in said[0]
    assert any("refreshed again after" in line and f"({TRIES - 1} more refused)" in line for line in back), back
