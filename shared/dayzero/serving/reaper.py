"""Re-run requests whose worker died: a lapsed lease means nobody is working on it.

The re-run carries the tokens already streamed, so the new prefill continues where the
stream stopped; stream entry ids derived from the token index make any replayed append a
no-op, and the attempt counter makes a late redelivery of the old task stale.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .messages import PrefillJob
from .store import P, Store

log = logging.getLogger("dayzero.reaper")
MAX_ATTEMPTS = 4


def sweep(store: Store, send: Callable[[PrefillJob, str], None], queued_ttl_s: float, lock_ms: int) -> list[str]:
    """One pass over the unfinished requests; returns the ids re-enqueued.

    ``send(job, stage)`` queues a re-run: at the vision stage when the request has images.
    """
    if not store.r.set(f"{P}reaper", 1, px=lock_ms, nx=True):
        return []  # another gateway swept just now
    rerun = []
    for rid in store.active():
        if store.done(rid):
            store.r.srem(f"{P}active", rid)
            continue
        if store.queued(rid) or store.owner(rid):
            continue
        request = store.request(rid)
        if request is None:
            store.r.srem(f"{P}active", rid)
            continue
        attempt = store.next_attempt(rid)
        generated = tuple(store.streamed_tokens(rid))
        if attempt > MAX_ATTEMPTS:
            store.end(rid, len(generated), "error", "the request failed on several workers")
            store.finish(rid, "error")
            continue
        log.warning("request %s lost its worker; re-running from token %d (attempt %d)", rid, len(generated), attempt)
        store.mark_queued(rid, queued_ttl_s)
        send(
            PrefillJob(request=request, generated=generated, attempt=attempt), "vision" if request.images else "prefill"
        )
        rerun.append(rid)
    return rerun
