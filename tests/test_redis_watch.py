"""``dayzero up`` says when a Redis it was given is lost after the stack was ready, and when it is
back: one line each, however long the outage (it said nothing). A real Redis, stopped and continued."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import redis

from dayzero import redis_watch
from dayzero.procs import free_port, start_redis
from dayzero.redis_watch import RedisWatch


def _checks(watch: RedisWatch, seconds: float) -> None:
    """up's loop: a check every 0.05 s for ``seconds``."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        watch.check()
        time.sleep(0.05)


def test_a_lost_redis_is_one_line_and_its_return_another(tmp_path, monkeypatch):
    monkeypatch.setattr(redis_watch, "CHECK_EVERY_S", 0.2)
    port = free_port()
    server = start_redis(port, tmp_path / "redis.log")
    said: list[str] = []
    try:
        watch = RedisWatch(f"redis://:secret@127.0.0.1:{port}/0", said.append)  # (it asks for none: taken)
        _checks(watch, 0.5)
        assert said == []
        server.send_signal(signal.SIGSTOP)  # a frozen Redis: its pings time out
        _checks(watch, 1.5)
        server.send_signal(signal.SIGCONT)
        _checks(watch, 1.0)
    finally:
        server.send_signal(signal.SIGCONT)
        server.terminate()
        server.wait()
    assert len(said) == 2, said
    assert (
        said[0].startswith(f"redis redis://:***@127.0.0.1:{port}/0 lost: Timeout ") and "/ready answers 503" in said[0]
    )
    assert said[1].startswith(f"redis redis://:***@127.0.0.1:{port}/0 back after ")
    assert "secret" not in "".join(said)


def test_up_watches_the_redis_it_was_given_once_ready(tiny_checkpoint, tmp_path, monkeypatch):
    from dayzero import cli, cli_up, redis_watch, stack

    watched, closed = [], []

    class Watch:
        def __init__(self, url, say):
            watched.append(url)

        def check(self):
            raise cli_up._Stop(signal.SIGINT)  # (up's loop ends as on Ctrl-C)

        def close(self):
            closed.append(True)

    for name, stub in {"start": None, "wait_ready": None, "supervise": [], "stop": []}.items():
        monkeypatch.setattr(stack.Stack, name, lambda self, *_, stub=stub, **__: stub)
    monkeypatch.setattr(redis_watch, "RedisWatch", Watch)  # (up imports it where it watches)
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setenv("DAYZERO_REDIS_URL", "redis://10.0.0.2:6379/0")
    assert cli.main(["up", "--checkpoint", str(tiny_checkpoint), "--log-dir", str(tmp_path / "logs")]) == 0
    assert watched == ["redis://10.0.0.2:6379/0"]
    assert closed == [True]  # (up's watch left its connection open)


def test_a_closed_watch_leaves_no_connection_to_the_redis(tmp_path):
    port = free_port()
    server = start_redis(port, tmp_path / "redis.log")
    try:
        watch = RedisWatch(f"redis://127.0.0.1:{port}/0", print)
        _checks(watch, 0.3)  # (its first ping answered)
        other = redis.Redis(port=port)
        clients = lambda: [c for c in other.client_list() if c["id"] != str(other.client_id())]  # noqa: E731
        assert len(clients()) == 1
        watch.close()
        until = time.monotonic() + 10  # (Redis drops a closed client at its next turn: later, loaded)
        while clients() and time.monotonic() < until:
            time.sleep(0.05)
        assert clients() == []
        other.close()
    finally:
        server.terminate()
        server.wait()


_SILENT_SENTINELS = """
import socket, sys, time
from dayzero.redis_watch import RedisWatch
listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(3)]  # (they accept, and never answer)
url = "redis+sentinel://" + ",".join(f"127.0.0.1:{s.getsockname()[1]}" for s in listeners) + "/dz/0"
RedisWatch(url, print).check()
time.sleep(0.2)
print(time.time(), flush=True)
"""


def test_up_exits_without_waiting_for_a_ping_in_flight():
    """up's loop ends (Ctrl-C) while a ping waits on three frozen sentinels (2 s each): the process
    exits then. The pinger was an executor's thread, which Python joins at exit: up's exit waited 6 s."""
    from dayzero.redis_urls import _SENTINEL_ASKED_S

    done = subprocess.run([sys.executable, "-c", _SILENT_SENTINELS], capture_output=True, text=True, timeout=60)
    exited = time.time()
    assert done.returncode == 0, done.stderr[-2000:]
    returned = float(done.stdout.split()[-1])
    assert exited - returned < _SENTINEL_ASKED_S, f"up's exit waited {exited - returned:.1f} s for its ping"
