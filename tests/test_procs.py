"""Free ports: picked where no outgoing connection can take them before their server binds; how a
child ended, as ``up`` says it."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess

from dayzero.procs import consecutive_ports, ephemeral_floor, exited, free_port


def test_a_free_port_is_below_the_ephemeral_range():
    """bind(0) gave an ephemeral port: a Redis client or an HTTP poll (this process's, or a parallel
    test worker's) could connect from it between the pick and the stack's server binding it."""
    assert all(free_port() < ephemeral_floor() for _ in range(50))


def test_consecutive_ports_are_free_together():
    base = consecutive_ports(3)
    assert base + 3 <= ephemeral_floor()
    with contextlib.ExitStack() as held:
        for port in range(base, base + 3):
            held.enter_context(socket.socket()).bind(("127.0.0.1", port))


def test_a_child_ended_by_a_signal_without_a_name_is_said_so():
    """A real-time signal (SIGRTMIN+6: 40, as ``kill -40`` sends) has no name in ``signal.Signals``:
    naming it raised ValueError in ``supervise``, and ``up`` stopped the whole stack, the child unrestarted."""
    child = subprocess.Popen(["sleep", "60"])
    child.send_signal(signal.SIGRTMIN + 6)
    assert exited(child.wait(timeout=10)) == f"exited (signal {int(signal.SIGRTMIN) + 6})"
    assert exited(-signal.SIGKILL) == "exited (SIGKILL)" and exited(3) == "exited (code 3)"
