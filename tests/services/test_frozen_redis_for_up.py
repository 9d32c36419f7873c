"""``dayzero up`` and a frozen Redis (SIGSTOP, then SIGCONT): no worker's liveness stamp ages while
up cannot read Redis, or reads it late, for no worker could stamp meanwhile (``Stack.frozen``).
Without that, every worker was found frozen and SIGKILLed at once the moment Redis answered again.

The worker here is a process that never stamps by itself: the test writes its stamps (the workers'
own script, at Redis's time), so none lands at SIGCONT before up's read. (A real worker's stamp
sent during the freeze often did, which hid a missing guard: test_worker_groups.py's freeze never
failed without it.)
"""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
import time
import types

import pytest
from redis.commands.core import Script

import dayzero.stack_stamps
from dayzero.procs import free_port, start_redis
from dayzero.serving.keys import key
from dayzero.serving.liveness import FORGET_S, STAMP, connect, process_id
from dayzero.stack import Child, Stack

FROZEN_S = 2.0  # DAYZERO_FROZEN_WORKER_S here
# up's client's read timeout (liveness.connect; it connects on its first command): a longer freeze fails a read
TIMEOUT_S = connect("redis://127.0.0.1:1/0").connection_pool.connection_kwargs["socket_timeout"]


def _frozen_redis_and_a_quiet_worker(tmp_path):
    """A Redis of the test's own (to SIGSTOP), a worker process that does not stamp, and a Stack
    that watches it with a bound of ``FROZEN_S`` -> (redis, worker, child, stack, a stamp of the worker)."""
    port = free_port()
    server = start_redis(port, tmp_path / "redis.log")
    url = f"redis://127.0.0.1:{port}/0"
    client = connect(url)
    started = time.monotonic()
    worker = subprocess.Popen(["sleep", "300"])
    child = Child("prefill0", "prefill", proc=worker, started=started)
    stack = Stack({}, 0, tmp_path, redis_url=url, children=[child], frozen_s=FROZEN_S)
    script = client.register_script(STAMP)
    process = process_id(worker.pid, socket.gethostname())
    keys = [key("alive", "prefill"), key("ready", "prefill"), key("stamp_now")]
    return server, worker, child, stack, lambda: script(keys=keys, args=[process, "now", ""])


def _found_frozen(stack: Stack, child: Child) -> None:
    """Passes as up's loop makes them until ``child`` is found frozen: within ``3 * FROZEN_S`` of the
    last read that came late, 60 s at most; else what each read saw. (On a starved host, CI's, up's
    reads took 1-3 s: each counted as one of a Redis that answered late, which it cannot tell apart,
    and moved ``_unread_at`` on; the first test's fixed 6 s ran out, both tests failed.)"""
    began, reads = time.monotonic(), []
    while time.monotonic() - max(began, stack._unread_at) < 3 * FROZEN_S and time.monotonic() - began < 60:
        read = stack.read_stamps()
        if stack.frozen(read) == [child]:
            return
        stamped = read.stamped(child) if read.stages else None
        age = "no stamp read" if stamped is None else f"its stamp {read.at - stamped:.2f} s old"
        late = " (late)" if read.late else ""
        reads.append(f"{read.at - began:.2f}: read in {read.at - read.began:.2f} s{late}, {age}")
        time.sleep(0.2)
    unread = time.monotonic() - stack._unread_at
    raise AssertionError(f"not found frozen; Redis last unread {unread:.2f} s ago; reads:\n" + "\n".join(reads))


def _clocks_dated(stack: Stack) -> None:
    """Reads until one is quick enough to date Redis's clock against this host's (``StampReader``): a
    late round trip is judged by Redis's clock from then on."""
    deadline = time.monotonic() + 30
    while stack.frozen() == [] and stack._stamps.offset_s is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stack._stamps.offset_s is not None, "no read of the stamps was quick in 30 s"


def _clock_stepped(monkeypatch, by_s: float) -> None:
    """This host's clock (time.time(), up's side of the dated clocks) steps ``by_s`` against Redis's: an
    NTP step on either host of a remote Redis. (Only StampReader's view of it: the rest of the test keeps
    the true clock.)"""
    stepped = types.SimpleNamespace(time=lambda: time.time() + by_s, monotonic=time.monotonic, sleep=time.sleep)
    monkeypatch.setattr(dayzero.stack_stamps, "time", stepped)


def _held_after_answer(call):
    """``call``, up's thread held 1.5 s after Redis answered it (a starved host): over STAMP_EVERY_S,
    within up's read timeout."""

    def held(*args, **options):
        answer = call(*args, **options)
        time.sleep(1.5)
        return answer

    return held


def _far_away(call, one_way_s: float):
    """``call`` across a network of ``one_way_s`` each way: Redis runs it ``one_way_s`` after its send,
    up has its answer as long after that."""

    def far(*args, **options):
        time.sleep(one_way_s)
        answer = call(*args, **options)
        time.sleep(one_way_s)
        return answer

    return far


def _stop(*procs: subprocess.Popen) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()


def test_redis_unreadable_past_the_bound_then_back_ages_no_stamp_meanwhile(tmp_path):
    """Redis frozen for twice the bound: up's reads time out. Once it answers again, a stamp from
    before the freeze is older than the bound, but the worker could not stamp: it is not frozen
    until the bound has passed since Redis was last unreadable (``_unread_at``); then it is."""
    server, worker, child, stack, stamp = _frozen_redis_and_a_quiet_worker(tmp_path)
    try:
        stamp()
        assert stack.frozen() == []
        server.send_signal(signal.SIGSTOP)
        found, frozen_until = [], time.monotonic() + 2 * FROZEN_S
        while time.monotonic() < frozen_until:
            found += stack.frozen()  # (each read times out)
        server.send_signal(signal.SIGCONT)
        answered = time.monotonic()
        found += stack.frozen()
        assert time.monotonic() - answered < 1.0, "Redis answered late: the slow-read clause's case, not this one"
        assert found == []
        _found_frozen(stack, child)
    finally:
        _stop(worker, server)


@pytest.mark.parametrize("stepped_s", [0.0, 5.0], ids=["clocks_steady", "clock_stepped_ahead"])
def test_a_read_redis_answers_late_ages_no_stamp_meanwhile(tmp_path, monkeypatch, stepped_s):
    """Redis frozen for less than up's read timeout, the read sent meanwhile answered at SIGCONT: the
    stamp it returns aged through the freeze, past the bound, while no worker could stamp. That read
    counts as one of a Redis up could not read (a read and its write check over ``STAMP_EVERY_S``), and so does the
    next; the worker is found frozen only once the bound has passed since. So too once this host's clock
    stepped 5 s ahead of Redis's after the clocks were dated: by the stale offset Redis ran the read 3.5 s
    before its send, counted 0 s late, and the quiet worker was found frozen at SIGCONT."""
    server, worker, child, stack, stamp = _frozen_redis_and_a_quiet_worker(tmp_path)
    try:
        stamp()
        _clocks_dated(stack)  # (the read is judged by Redis's clock: it ran at SIGCONT, 1.5 s after its send)
        _clock_stepped(monkeypatch, stepped_s)
        time.sleep(FROZEN_S - 0.5)  # (a stamp period and a loaded scheduler's delay)
        server.send_signal(signal.SIGSTOP)
        # frozen 1.5 s: the read, sent just after, must outlast STAMP_EVERY_S (1 s) by a loaded scheduler's
        # delay (frozen 1.0 s, a read began late under CI load took 0.99 s: counted as answered in time)
        # and end within up's read timeout (2 s)
        continued = threading.Timer(1.5, server.send_signal, (signal.SIGCONT,))
        continued.start()
        began = time.monotonic()
        found = stack.frozen()
        read_s = time.monotonic() - began
        continued.join()
        assert 0.5 < read_s < TIMEOUT_S, f"the read took {read_s:.2f} s: it was not answered late by a continued Redis"
        assert found == []
        assert stack.frozen() == []
        _found_frozen(stack, child)
    finally:
        _stop(worker, server)


@pytest.mark.parametrize("forgettable", [False, True], ids=["no_stamp_to_forget", "a_stamp_to_forget"])
def test_writes_held_then_answered_age_no_stamp_meanwhile(tmp_path, forgettable):
    """Redis holding writes (CLIENT PAUSE WRITE) answers up's read at once and its write check when the
    pause ends: no worker could stamp till then (the stamps are writes too). ``_unread_at`` was the
    read's answer: the pause aged the stamp, and the next read found the worker frozen. So too with a
    stamp past ``FORGET_S`` in the hash (a restarted worker's old pid): the read's own removal of it (an
    HDEL, after the read's TIME) was held by the pause, and the write check sent after ran at once: by
    Redis's clock neither was late."""
    server, worker, child, stack, stamp = _frozen_redis_and_a_quiet_worker(tmp_path)
    try:
        stamp()
        _clocks_dated(stack)
        if forgettable:
            client = connect(stack.redis_url)
            client.hset(key("alive", "prefill"), "elsewhere:1", client.time()[0] - FORGET_S - 60)
        stack.frozen_s = 1.5  # (below the pause, 1.8 s, itself within up's read timeout)
        connect(stack.redis_url).execute_command("CLIENT", "PAUSE", 1800, "WRITE")
        began = time.monotonic()
        assert stack.frozen() == []
        assert time.monotonic() - began > 1.0, "the write check was not held by the pause"
        assert stack.frozen() == [], "the stamp aged through a pause of writes, while no worker could stamp"
    finally:
        _stop(worker, server)


def test_up_s_own_thread_held_after_redis_answered_is_not_taken_for_a_frozen_redis(tmp_path, monkeypatch):
    """A starved host held up's thread after Redis had answered (CI, nice 12 beside 12 burners: reads of
    1.0-3.9 s): each read counted as one a frozen Redis answered late, ``_unread_at`` moved every pass,
    and a frozen worker was never found. Here every read is held 1.5 s after Redis's answer
    (``seen_stages`` wrapped), Redis healthy: no read counts late, and the quiet worker is found frozen."""
    server, worker, child, stack, stamp = _frozen_redis_and_a_quiet_worker(tmp_path)
    try:
        stamp()
        _clocks_dated(stack)
        monkeypatch.setattr(dayzero.stack_stamps, "seen_stages", _held_after_answer(dayzero.stack_stamps.seen_stages))
        held_from = time.monotonic()
        _found_frozen(stack, child)
        assert stack._unread_at < held_from, "a read held by up's own thread counted as one Redis answered late"
    finally:
        _stop(worker, server)


def test_a_clock_stepped_back_after_dating_does_not_defer_the_frozen_check(tmp_path, monkeypatch):
    """The clocks dated, this host's clock steps 5 s behind Redis's, Redis healthy: by the stale offset
    every round trip ran 5 s after its send, each read counted late and moved ``_unread_at`` until a
    re-dating (a quicker round trip, or ``REDATED_AFTER_S``: 60 s): the quiet worker was not found frozen
    meanwhile. Now the first read after the step drops the offset (Redis ran it after its answer), and
    the next quick one dates the clocks again."""
    server, worker, child, stack, stamp = _frozen_redis_and_a_quiet_worker(tmp_path)
    try:
        stamp()
        _clocks_dated(stack)
        # (no later round trip quicker than the one that dated them, as on a loaded host: none re-dates them)
        stack._stamps._dated_by = (0.0, time.monotonic())
        _clock_stepped(monkeypatch, -5.0)
        _found_frozen(stack, child)
    finally:
        _stop(worker, server)


def test_up_starved_from_its_first_read_on_its_own_redis_still_finds_a_frozen_worker(tmp_path, monkeypatch):
    """up's own Redis (``redis_port``: a child of up, on this host's clock) and up starved from the start:
    its read and its write check each held 1.5 s after Redis answered (CI's reads took 1.0-3.9 s), so no
    round trip is quick enough (``DATES_CLOCKS_S``) to date Redis's clock against this host's. Each read
    counted whole, late, moved ``_unread_at``: the quiet worker was never found frozen. Redis on this host
    has no offset to date: each round trip is judged by its TIME from the first."""
    server, worker, child, stack, stamp = _frozen_redis_and_a_quiet_worker(tmp_path)
    stack.redis_port = connect(stack.redis_url).connection_pool.connection_kwargs["port"]  # (up's own Redis)
    try:
        stamp()
        monkeypatch.setattr(dayzero.stack_stamps, "seen_stages", _held_after_answer(dayzero.stack_stamps.seen_stages))
        monkeypatch.setattr(Script, "__call__", _held_after_answer(Script.__call__))  # (the write check)
        _found_frozen(stack, child)
    finally:
        _stop(worker, server)


def test_a_worker_hung_as_its_redis_restarts_is_still_found_frozen(tmp_path):
    """A restarted Redis (up restarts its own; an operator a remote one) holds no stamp: a running worker
    stamps again at once (Pulse), a hung one never does. Its missing stamp was taken for one not stamped
    yet (a starting worker's): never found frozen. A ready worker's lost stamp ages from the last one up read."""
    server, worker, child, stack, stamp = _frozen_redis_and_a_quiet_worker(tmp_path)
    port = connect(stack.redis_url).connection_pool.connection_kwargs["port"]
    try:
        stamp()
        child.ready_at = time.monotonic()  # (up saw it ready)
        assert stack.frozen() == []
        server.kill()
        server.wait()
        server = start_redis(port, tmp_path / "restarted.log")  # (empty: no stamp)
        _found_frozen(stack, child)
    finally:
        _stop(worker, server)


@pytest.mark.parametrize("one_way_s", [0.3, 0.55])
def test_a_remote_redis_far_away_still_finds_a_frozen_worker(tmp_path, monkeypatch, one_way_s):
    """A remote Redis whose every round trip takes 0.6 s (0.3 s each way: a satellite link, a far VPN),
    healthy. Only a round trip under 0.5 s dated Redis's clock: none did, each read and its write check
    counted whole (1.2 s, over ``STAMP_EVERY_S``), every read counted late and moved ``_unread_at``, and
    the quiet worker was never found frozen (the frozen check silently off). By Redis's clock each ran
    0.3 s after its send, the way there: no read is late, and the worker is found frozen. At 0.55 s each
    way the way there counted, 1.1 s a read and its write: every read late again, never found frozen."""
    server, worker, child, stack, stamp = _frozen_redis_and_a_quiet_worker(tmp_path)
    try:
        stamp()
        monkeypatch.setattr(dayzero.stack_stamps, "seen_stages", _far_away(dayzero.stack_stamps.seen_stages, one_way_s))
        monkeypatch.setattr(Script, "__call__", _far_away(Script.__call__, one_way_s))  # (the write check)
        _found_frozen(stack, child)
    finally:
        _stop(worker, server)
