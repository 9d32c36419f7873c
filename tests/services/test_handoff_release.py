"""A prefill worker's release of the handoffs whose blocks it keeps (Lifecycle.released): decode's
notices in its inbox, the marks of a run that is over, against a real Redis."""

from __future__ import annotations

import contextlib

import redis

from dayzero.serving.keys import HANDOFF_OWNER, key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.scripts import Take

from .lifecycle_requests import request


def test_a_holder_may_free_the_handoffs_decode_took_or_whose_run_is_over(redis_url):
    store = Lifecycle(redis.Redis.from_url(redis_url))
    ids = ("k-taken", "k-cancelled", "k-ended", "k-rerun", "k-waits")
    for rid in ids:
        store.admit(request(rid), [], "", 60)
    assert store.take_handoffs([("k-taken", 0, "prefill5")], "decode0", 30) == {"k-taken": Take.CLAIMED}
    store.cancel("k-cancelled")
    store.r.set(key("done", "k-ended"), "stop")
    store.r.set(key("attempt", "k-rerun"), 1)
    held = dict.fromkeys(ids, 0)
    assert store.released("prefill5", held) == {"k-taken", "k-cancelled", "k-ended", "k-rerun"}
    assert store.released("prefill5", {"k-waits": 0}) == set()  # the inbox was read once
    assert store.released("prefill5", {}) == set()
    store.r.set(key("lease", "k-waits"), HANDOFF_OWNER)  # past its deadline: freed unless decode claimed it
    assert store.released("prefill5", {"k-waits": 0}, lapsed={"k-waits"}) == {"k-waits"}
    store.r.set(key("lease", "k-waits"), "decode1")  # claimed: decode copies it once it has room
    assert store.released("prefill5", {"k-waits": 0}, lapsed={"k-waits"}) == set()


def test_a_holders_notice_outlives_a_lost_reply(redis_url, monkeypatch):
    """A release whose reply is lost (the connection dropped after Redis ran it; redis-py's retry runs it
    again) deleted the inbox it read: the notice was gone, the blocks kept till the request ended. A
    notice leaves the inbox only at the call after the one that read it: read by one of the two."""
    store = Lifecycle(redis.Redis.from_url(redis_url))
    store.admit(request("l-taken"), [], "", 60)
    store.take_handoffs([("l-taken", 0, "prefill6")], "decode0", 30)
    read, lost = redis.connection.AbstractConnection.read_response, []

    def reply_lost(connection, *args, **kwargs):
        if not lost:  # (the first reply of the release: Redis has run all it was sent)
            lost.append(connection.disconnect())
            raise redis.ConnectionError("the connection dropped before the reply")
        return read(connection, *args, **kwargs)

    monkeypatch.setattr(redis.connection.AbstractConnection, "read_response", reply_lost)
    freed = set()
    with contextlib.suppress(redis.ConnectionError):  # (retried, or not: the caller's next call)
        freed |= store.released("prefill6", {"l-taken": 0})
    monkeypatch.setattr(redis.connection.AbstractConnection, "read_response", read)
    assert lost
    freed |= store.released("prefill6", {"l-taken": 0})
    assert freed == {"l-taken"}
    assert store.released("prefill6", {}) == set()


def test_a_notice_of_an_older_run_frees_none_of_the_run_held(redis_url):
    """Decode took run 0 and died; the request was re-run and prefilled here again before a release read
    the inbox: run 0's notice (the request's id alone) freed run 1's blocks, which decode had not taken
    (it would copy blocks another request may have been given). A notice frees only the run it names."""
    store = Lifecycle(redis.Redis.from_url(redis_url))
    store.admit(request("o-rerun"), [], "", 60)
    assert store.take_handoffs([("o-rerun", 0, "prefill8")], "decode0", 30) == {"o-rerun": Take.CLAIMED}
    store.r.set(key("attempt", "o-rerun"), 1)  # (the reaper's re-run)
    store.r.delete(key("lease", "o-rerun"))
    assert store.released("prefill8", {"o-rerun": 1}) == set()
    assert store.take_handoffs([("o-rerun", 1, "prefill8")], "decode1", 30) == {"o-rerun": Take.CLAIMED}
    assert store.released("prefill8", {"o-rerun": 1}) == {"o-rerun"}
    store.r.rpush(key("taken", "prefill8"), "o-rerun")  # (a decode worker of a version before: no run named)
    assert store.released("prefill8", {"o-rerun": 1}) == {"o-rerun"}
