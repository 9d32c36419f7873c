"""A real redis-server that can be made unreachable: run in a network namespace of its own behind a veth
pair, its end of the pair set down (every packet to and from it dropped: connections hang, none is
refused or reset) and up again; or, ``partitioned``, both ends left up and every packet dropped both
ways (each end's egress into a ``blackhole`` qdisc: no NO-CARRIER, routes and addresses kept, as a
partition in the network between two hosts). Root and ``ip netns`` (iproute2) needed: ``netns_usable``. Its replies
sent while cut are retransmitted with TCP's backoff (0.2, 0.4, 0.8, ... s apart): ``rto_max_ms`` caps
it (the namespace's ``net.ipv4.tcp_rto_max_ms``, Linux 6.15 on), as that sysctl on a Redis host would."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dayzero.procs import redis_binary

PORT = 6379


def netns_usable() -> bool:
    """Whether this process may make network namespaces and veth pairs (root, iproute2 here)."""
    return hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("ip") is not None


def partition_usable() -> bool:
    """``netns_usable`` and ``tc`` here (a PartitionedRedis's qdiscs)."""
    return netns_usable() and shutil.which("tc") is not None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@dataclass(frozen=True)
class UnreachableRedis:
    url: str
    namespace: str
    link: str  # Redis's end of the veth pair, in ``namespace``
    host_link: str  # this host's end

    def cut(self) -> None:
        """Every packet dropped from now on (the host's end: NO-CARRIER), no connection refused or reset."""
        _ip("-n", self.namespace, "link", "set", self.link, "down")

    def mend(self) -> None:
        _ip("-n", self.namespace, "link", "set", self.link, "up")


class PartitionedRedis(UnreachableRedis):
    """``cut``: both links up, every packet dropped both ways (the host's end sees no change of carrier)."""

    def cut(self) -> None:
        _ip("netns", "exec", self.namespace, "tc", "qdisc", "add", "dev", self.link, "root", "blackhole")
        subprocess.run(["tc", "qdisc", "add", "dev", self.host_link, "root", "blackhole"], check=True)

    def mend(self) -> None:
        subprocess.run(["tc", "qdisc", "del", "dev", self.host_link, "root"], check=True)
        _ip("netns", "exec", self.namespace, "tc", "qdisc", "del", "dev", self.link, "root")


@contextmanager
def unreachable_redis(
    log: Path, rto_max_ms: int | None = None, partitioned: bool = False
) -> Iterator[UnreachableRedis]:
    """A redis-server in a namespace of its own (its log in ``log``), reachable from this host at its
    ``url`` until ``cut`` (``partitioned``: a PartitionedRedis); server, pair and namespace gone on
    the way out."""
    tag = f"{os.getpid() % 100000}{random.randrange(100)}"
    namespace, host_end, redis_end, subnet = f"dz{tag}", f"dz{tag}h", f"dz{tag}r", f"10.213.{random.randrange(1, 250)}"
    _ip("netns", "add", namespace)
    server = None
    try:
        if rto_max_ms is not None:  # (before the server starts: a socket takes it when made)
            _ip("netns", "exec", namespace, "sysctl", "-qw", f"net.ipv4.tcp_rto_max_ms={rto_max_ms}")
        _ip("link", "add", host_end, "type", "veth", "peer", "name", redis_end)
        _ip("link", "set", redis_end, "netns", namespace)
        _ip("addr", "add", f"{subnet}.1/24", "dev", host_end)
        _ip("link", "set", host_end, "up")
        _ip("-n", namespace, "addr", "add", f"{subnet}.2/24", "dev", redis_end)
        _ip("-n", namespace, "link", "set", redis_end, "up")
        argv = ["ip", "netns", "exec", namespace, redis_binary(), "--port", str(PORT), "--bind", f"{subnet}.2"]
        argv += ["--save", "", "--appendonly", "no", "--protected-mode", "no"]
        server = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while "Ready to accept connections" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        kind = PartitionedRedis if partitioned else UnreachableRedis
        yield kind(f"redis://{subnet}.2:{PORT}/0", namespace, redis_end, host_end)
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        subprocess.run(["ip", "link", "del", host_end], check=False, capture_output=True)
        _ip("netns", "del", namespace)
