"""A worker's liveness stamps against a real Redis: a long step does not stop them, a step past its
bound does (``dayzero up`` then restarts the worker, the gateway counts its stage as without one:
test_liveness_count.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import redis

from dayzero.serving import liveness
from dayzero.serving.lease import Heartbeat
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.liveness import (
    FRESH_S,
    STAMP_EVERY_S,
    Pulse,
    connect,
    process_id,
    serving,
    stamps,
    stopped_child,
)
from dayzero.serving.no_worker_count import unserved_for
from dayzero.stack import Child, Stack

from .conftest import SETTINGS_ENV, wait_until
from .test_decode_appends import writes_refused


def test_a_long_step_keeps_stamping_a_step_past_its_bound_stops_until_it_ends(redis_url):
    client = redis.Redis.from_url(redis_url)
    store, stop = Lifecycle(client), threading.Event()
    long_step = Heartbeat(store, "w", 30.0, stop, 60.0, stalled_s=0.5)  # (between steps: 0.5 s)
    hung_step = Heartbeat(store, "w", 30.0, stop, 0.3)
    pulse = Pulse(connect(redis_url), "decode").start()
    stamped = lambda: stamps(client, "decode").get(pulse.process, 0.0)  # noqa: E731
    try:
        pulse.ready()
        pulse.watch(long_step.stuck)
        long_step.moved()
        with long_step.step():  # a million-token prefill forward: minutes, within its bound (not a stall)
            first = wait_until(stamped, 5)
            assert wait_until(lambda: stamped() > first, 3 * STAMP_EVERY_S)
        assert not long_step.stuck() and unserved_for(client, "decode") == 0.0  # the step's end moved the loop on
        assert wait_until(long_step.stuck, 2)  # then no move for 0.5 s between steps
        pulse.watch(hung_step.stuck)
        with hung_step.step():
            time.sleep(0.3 + STAMP_EVERY_S)
            last = stamped()
            assert wait_until(lambda: time.time() - last > FRESH_S, FRESH_S + 2)
            assert stamped() == last and wait_until(lambda: unserved_for(client, "decode") > 0.0, 1)
        assert wait_until(lambda: stamped() > last, 3 * STAMP_EVERY_S)  # the step returned after all
        assert unserved_for(client, "decode") == 0.0
    finally:
        pulse.stop()
        stop.set()
    assert pulse.process not in stamps(client, "decode")  # a stopping worker leaves at once


def test_a_stopped_child_rank_stops_the_stamps_until_it_is_continued(redis_url, monkeypatch):
    """A tensor-parallel worker's other ranks are its rank 0's children: one SIGSTOPped hangs the
    group's next collective until the group's timeout (120 s), so the worker is as good as frozen."""
    every_s = 0.5  # liveness.STAMP_EVERY_S here (1 s): the periods this test waits out
    monkeypatch.setattr(liveness, "STAMP_EVERY_S", every_s)
    client = redis.Redis.from_url(redis_url)
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    pulse = Pulse(connect(redis_url), "decode").start()
    stamped = lambda: stamps(client, "decode").get(pulse.process, 0.0)  # noqa: E731
    try:
        first = wait_until(stamped, 5)
        assert not stopped_child() and wait_until(lambda: stamped() > first, 3 * every_s)
        rank.send_signal(signal.SIGSTOP)
        assert wait_until(stopped_child, 5)
        time.sleep(2 * every_s)  # a stamp under way when it stopped lands
        last = stamped()
        time.sleep(2 * every_s)
        assert stamped() == last
        rank.send_signal(signal.SIGCONT)
        assert wait_until(lambda: stamped() > last, 3 * every_s)
    finally:
        pulse.stop()
        rank.kill()
        rank.wait()


# a worker's liveness stamps (its Pulse) in a process of its own, as under `dayzero up`
PULSE = """
import sys, time
from dayzero.serving.liveness import Pulse, connect
Pulse(connect(sys.argv[1]), "prefill").start().ready()
time.sleep(300)
"""


def test_redis_refusing_writes_past_the_frozen_bound_freezes_no_worker_for_up(redis_url, tmp_path):
    """Redis refusing writes (at its maxmemory; also a read-only replica, writes paused) stops every
    worker's stamps, which are writes, while `dayzero up` still reads them: it found them all old
    and SIGKILLed every worker at once (the soak: a 7 s write pause against a 6 s bound restarted
    all five). No stamp ages while Redis refuses up's own write; a worker SIGSTOPped once writes
    are back is still found frozen."""
    client = redis.Redis.from_url(redis_url)
    started = time.monotonic()
    worker = subprocess.Popen([sys.executable, "-c", PULSE, redis_url])
    child = Child("prefill0", "prefill", proc=worker, started=started)
    stack = Stack({}, 0, tmp_path, redis_url=redis_url, children=[child], frozen_s=2.0)
    try:
        assert wait_until(lambda: process_id(worker.pid, socket.gethostname()) in stamps(client, "prefill"), 60)
        client.config_set("maxmemory", 1)
        try:
            found, refused_until = [], time.time() + 3 * stack.frozen_s
            while time.time() < refused_until:
                found += stack.frozen()
                time.sleep(0.2)
        finally:
            client.config_set("maxmemory", 0)
        assert found == []
        worker.send_signal(signal.SIGSTOP)
        assert wait_until(lambda: stack.frozen() == [child], 5 * stack.frozen_s, step_s=0.2)
    finally:
        worker.kill()
        worker.wait()


# a decode worker whose loop thread, once the file argv[1] exists, blocks between two steps until it
# is gone (as on a collective or a call that never returns, a deadlock): its other threads run on
BLOCKED_LOOP = """
import os, sys, time
from dayzero.serving import ranks
keepalive = ranks.Ranks.keepalive
def blocking(self):
    while os.path.exists(sys.argv[1]):
        time.sleep(0.05)
    keepalive(self)
ranks.Ranks.keepalive = blocking
from dayzero.cli import main
sys.exit(main(["serve", "decode", "--name", "blocked0"]))
"""


BOUND_S = 3.0  # DAYZERO_GROUP_TIMEOUT_S: well past what a loaded machine's scheduling holds a thread


def test_a_loop_blocked_between_steps_stops_the_stamps_an_idle_one_does_not(redis_url, text_dir, tmp_path):
    """A loop thread blocked outside a forward (the process runs, its liveness thread stamps on) was
    never seen as frozen: ``dayzero up`` never restarted it, and the requests it held waited for the
    reaper's bounds. Now its worker stamps nothing once its loop has not moved between steps for
    DAYZERO_GROUP_TIMEOUT_S; an idle loop (waiting on its intake) moves on every 50 ms."""
    client, block = redis.Redis.from_url(redis_url), tmp_path / "block"
    env = {**os.environ, **SETTINGS_ENV, "DAYZERO_REDIS_URL": redis_url, "DAYZERO_CHECKPOINT": str(text_dir)}
    env["DAYZERO_GROUP_TIMEOUT_S"] = str(BOUND_S)
    with (tmp_path / "worker.log").open("wb") as log:
        worker = subprocess.Popen([sys.executable, "-c", BLOCKED_LOOP, str(block)], env=env, stdout=log, stderr=log)
    process = process_id(worker.pid)
    stamped = lambda: stamps(client, "decode").get(process, 0.0)  # noqa: E731
    try:
        assert wait_until(lambda: process in serving(client, "decode"), 120), (tmp_path / "worker.log").read_text()
        time.sleep(BOUND_S + 1)  # idle, past the bound: it stamps on
        idle = stamped()
        assert process in serving(client, "decode") and wait_until(lambda: stamped() > idle, 3 * STAMP_EVERY_S)
        block.touch()
        assert wait_until(lambda: process not in serving(client, "decode"), BOUND_S + FRESH_S + 3 * STAMP_EVERY_S)
        last = stamped()
        time.sleep(2 * STAMP_EVERY_S)
        assert stamped() == last  # (up restarts it after DAYZERO_FROZEN_WORKER_S)
        block.unlink()
        assert wait_until(lambda: process in serving(client, "decode"), 3 * STAMP_EVERY_S)  # it moves on again
        assert "the loop is stuck: no more liveness stamps" in (tmp_path / "worker.log").read_text()
    finally:
        block.unlink(missing_ok=True)
        worker.terminate()
        worker.wait(30)


def test_dayzero_alive_fails_once_this_hosts_worker_stamps_no_more(redis_url, monkeypatch, capsys):
    """The compose healthchecks pinged Celery only: a loop hung past its step's bound (no more
    stamps) still answered, and its container stayed healthy for good. ``dayzero alive <stage>``
    reads this host's (this container's) stamps."""
    from dayzero.cli import main

    client, host = redis.Redis.from_url(redis_url), socket.gethostname()
    client.delete("dz:alive:vision")
    monkeypatch.setenv("DAYZERO_REDIS_URL", redis_url)
    try:
        client.hset("dz:alive:vision", "another-host:7", time.time())  # another container's worker
        assert main(["alive", "vision"]) == 1
        assert capsys.readouterr().out == f"no vision worker on {host} has stamped its liveness\n"
        client.hset("dz:alive:vision", f"{host}:1", time.time() - 100)  # frozen 100 s ago
        assert main(["alive", "vision"]) == 1 and "stamped its liveness 100." in capsys.readouterr().out
        assert main(["alive", "vision", "--within", "200"]) == 0
        pulse = Pulse(connect(redis_url), "vision").start()  # the same container's worker, restarted
        try:
            assert wait_until(lambda: stamps(client, "vision").get(pulse.process), 5)
            assert main(["alive", "vision"]) == 0
        finally:
            pulse.stop()
    finally:  # (its made-up stamps left for the module's next tests)
        client.hdel("dz:alive:vision", "another-host:7", f"{host}:1")
    monkeypatch.setenv("DAYZERO_REDIS_URL", "redis://127.0.0.1:1/0")  # nobody: the workers cannot stamp either
    assert main(["alive", "vision"]) == 0 and "not counted against the worker" in capsys.readouterr().out


def test_a_worker_serves_its_stage_the_moment_it_is_ready(redis_url):
    """Its loop announces it (the gateway takes it for ready) as soon as it runs: a ready entry
    written only at the next stamp, up to a second later, left the stage unserved meanwhile, and
    after a load longer than DAYZERO_NO_WORKER_TIMEOUT_S the requests sent then ended no_worker."""
    client = connect(redis_url)
    pulse = Pulse(client, "vision")  # no stamping thread: only what ready() itself writes
    assert pulse.process not in serving(client, "vision")
    pulse.ready()
    assert pulse.process in serving(client, "vision")
    pulse.stop()


def test_a_stamp_redis_refused_goes_again_at_once_so_the_worker_serves_as_writes_come_back(redis_url, monkeypatch):
    """A stamp Redis refused (out of memory, too few replicas, or down) waited for the next one, a
    period later: every stamp had aged through the refusal, and ``/ready`` said "no live worker" for
    0.4-0.8 s after it, the workers serving throughout. Now a failed stamp goes again after
    STAMP_RETRY_S (here the period is longer than the wait for it)."""
    monkeypatch.setattr(liveness, "STAMP_EVERY_S", 60.0)
    client = redis.Redis.from_url(redis_url)
    pulse = Pulse(connect(redis_url), "prefill")
    refused = lambda: sum(error["count"] for error in client.info("errorstats").values())  # noqa: E731
    try:
        with writes_refused(client):
            pulse.ready()  # (refused: ready, not stamped)
            before = refused()
            pulse.start()  # its first stamp refused
            assert wait_until(lambda: refused() > before, 10)
        assert wait_until(lambda: pulse.process in serving(client, "prefill"), 10)  # (was: a period later)
    finally:
        pulse.stop()
