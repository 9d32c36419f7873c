"""Keeping a request's lease alive while one long piece of work runs."""

from __future__ import annotations

import logging
import threading

import redis

from .lifecycle import Lifecycle

log = logging.getLogger("dayzero.lease")


class Heartbeat:
    """Refreshes the leases of ``ids`` (owned by ``owner``) until the block ends, or until a request
    is ``release``d from it (its lease is about to change hands)."""

    def __init__(self, store: Lifecycle, ids: list[str], owner: str, lease_s: float) -> None:
        self._store, self._ids, self._owner, self._lease_s = store, list(ids), owner, lease_s
        self._stop = threading.Event()
        self._lock = threading.Lock()  # a beat in flight finishes before a release returns
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self) -> None:
        while not self._stop.wait(self._lease_s / 3):
            with self._lock:
                try:
                    self._store.heartbeat(self._ids, self._owner, self._lease_s)
                except redis.RedisError:
                    log.warning("heartbeat failed; retrying")

    def release(self, request_id: str) -> None:
        """No more beats for ``request_id``: none in flight can overwrite what its owner writes next
        (a handoff lease, its end)."""
        with self._lock:
            if request_id in self._ids:
                self._ids.remove(request_id)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
