"""A worker's queue reads: its broker connections named, so that its consumer's queue read blocked in
Redis (a BRPOP of up to 1 s) can be ended at once: before it hands messages back (room.py), and when
it begins to stop (worker.py)."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid

import redis
from celery import Celery

READ_S = 1.0  # how long the consumer's queue read waits in Redis (kombu's BRPOP timeout, its poll)
AGAIN_S = 0.01  # how often a queue read is looked for again (QueueReads.end_now_or_next)


class QueueReads:
    """A worker's reads of its queue: its broker connections, named ``name`` (Redis's CLIENT LIST;
    ``app``: the worker's Celery app, None: named nothing), and ``end``, which ends the consumer's
    read that waits blocked in Redis: a BRPOP, sent while the worker could take messages, that takes
    the next message pushed up to READ_S later (kombu's poll), whatever the worker decided since."""

    def __init__(self, app: Celery | None = None) -> None:
        self.name = f"dayzero-reads-{uuid.uuid4().hex[:12]}"
        self._looking = threading.Lock()  # (end_now_or_next's thread)
        self._looking_until: float | None = None  # (till when it looks; None: no thread looks)
        self._mine: list[str] = []  # the ids of this worker's connections its last full look listed
        if app is not None:
            app.conf.broker_transport_options = {**app.conf.broker_transport_options, "client_name": self.name}

    def end(self, client: redis.Redis) -> bool:
        """End this worker's queue read blocked in Redis, if one is (``CLIENT UNBLOCK``): it answers
        nil, which the consumer reads as its poll's timeout. A Redis that refuses CLIENT (ACLs): the
        read ends with its poll. -> whether one was ended."""
        ended, self._mine = self._unblock(client, [])
        return ended

    def _unblock(self, client: redis.Redis, among: list[str]) -> tuple[bool, list[str]]:
        """``end`` among the connections of ids ``among`` only (``CLIENT LIST ID``: a line each), or
        all of Redis's ([]: ``CLIENT LIST``, a line per client in Redis: ~0.2 ms of Redis's time and
        ~1 ms of this process's at 150 clients, ~1.1 ms and ~8 ms at 1,000); a Redis older than 6.2
        (no ID): all. -> whether one was ended, and the ids of this worker's connections listed."""
        ended, mine = False, []
        try:
            listed = client.client_list(client_id=among) if among else client.client_list(_type="normal")
        except redis.ResponseError:
            return self._unblock(client, []) if among else (False, [])
        with contextlib.suppress(redis.ResponseError):
            for reader in listed:
                if reader.get("name") != self.name:
                    continue
                mine.append(reader["id"])
                if reader.get("cmd") == "brpop" and "b" in reader.get("flags", ""):
                    ended = bool(client.client_unblock(reader["id"])) or ended
        return ended, mine

    def end_now_or_next(self, client: redis.Redis) -> None:
        """``end`` for a consumer just told to take no more messages: its worker begins to stop
        (Celery's stop flag), or pauses before a hand back (room.py's ``Prefetch.withhold``). Celery
        sees either between two reads: told after its check and before its next read is sent (or
        while it is on its way to Redis), it found no read blocked, and the next one waited its whole
        READ_S (taking a message pushed meanwhile). Then ended again every AGAIN_S on a thread, until
        one was or READ_S passed (the consumer, which sends at most one more read before it sees
        what it was told, saw it); one such thread at a time (told again meanwhile: it looks READ_S
        from then). The thread lists only the connections this worker had at the first look (the
        consumer sends that read on its own): a whole CLIENT LIST each time (35-85 a look) cost Redis
        ~16 ms a look at 150 clients, ~40 ms at 500-1,000, and this process 0.1-0.3 s of CPU."""
        if self.end(client):
            return
        with self._looking:
            starts = self._looking_until is None
            self._looking_until = time.monotonic() + READ_S
        if starts:
            threading.Thread(target=self._end_next, args=(client,), name=f"end-{self.name}", daemon=True).start()

    def _end_next(self, client: redis.Redis) -> None:
        while True:
            time.sleep(AGAIN_S)
            with self._looking:  # (a call meanwhile waits for this look: it then starts another, or extends it)
                try:
                    ended, self._mine = self._unblock(client, self._mine)  # (none listed: a full look next)
                    over = ended or time.monotonic() >= (self._looking_until or 0.0)
                except redis.RedisError:  # (Redis down: the read ends with its poll)
                    over = True
                if over:
                    self._looking_until = None
                    return
