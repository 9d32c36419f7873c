"""Free ports: picked where no outgoing connection can take them before their server binds."""

from __future__ import annotations

import contextlib
import socket

from dayzero.procs import consecutive_ports, ephemeral_floor, free_port


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
