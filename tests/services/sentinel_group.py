"""A Redis that a sentinel watches, all real processes (the bundled redis-server): a master, its
replica, and one sentinel (quorum 1, the master down after ``DOWN_AFTER_MS``), stopped on the way out."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

from dayzero.procs import consecutive_ports, redis_binary, spawn, start_redis

from .conftest import wait_until

MASTER_NAME = "dz"
DOWN_AFTER_MS = 1000


@dataclass
class SentinelGroup:
    master_port: int
    replica_port: int
    sentinel_port: int
    procs: dict[str, subprocess.Popen]

    def url(self, db: int = 0) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/{MASTER_NAME}/{db}"

    def master_says(self) -> int:
        """The master's port, as the sentinel names it (asked directly)."""
        sentinel = redis.Redis(port=self.sentinel_port, socket_timeout=2)
        return int(sentinel.sentinel_get_master_addr_by_name(MASTER_NAME)[1])


def _replica_known(sentinel: redis.Redis) -> bool:
    with contextlib.suppress(redis.RedisError):
        return any(not replica["is_sdown"] for replica in sentinel.sentinel_slaves(MASTER_NAME))
    return False


@contextlib.contextmanager
def sentinel_group(folder: Path) -> Iterator[SentinelGroup]:
    base = consecutive_ports(3)
    group = SentinelGroup(base, base + 1, base + 2, {})
    try:
        group.procs["master"] = start_redis(group.master_port, folder / "master.log")
        group.procs["replica"] = start_redis(group.replica_port, folder / "replica.log")
        for port in (group.master_port, group.replica_port):  # (a replica's sync writes an RDB file there)
            redis.Redis(port=port).config_set("dir", str(folder))
        replica = redis.Redis(port=group.replica_port)
        replica.replicaof("127.0.0.1", group.master_port)
        assert wait_until(lambda: replica.info("replication")["master_link_status"] == "up", 10)
        conf = folder / "sentinel.conf"  # (the sentinel rewrites it: its own file)
        conf.write_text(
            f"port {group.sentinel_port}\nbind 127.0.0.1\n"
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {group.master_port} 1\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {MASTER_NAME} 10000\n"
        )
        group.procs["sentinel"] = spawn([redis_binary(), str(conf), "--sentinel"], folder / "sentinel.log")
        assert wait_until(lambda: _replica_known(redis.Redis(port=group.sentinel_port, socket_timeout=1)), 20)
        yield group
    finally:
        for proc in group.procs.values():
            proc.kill()
            proc.wait()
