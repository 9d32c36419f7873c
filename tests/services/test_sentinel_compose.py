"""docker/sentinel.compose.yml's own commands, run here as real processes (the bundled redis-server; the
hosts and ports of the compose network replaced by this host's): what its restart policy does to a
server or a sentinel restarted at once."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import redis
import yaml

from dayzero.procs import consecutive_ports, redis_binary

from .conftest import wait_until

ROOT = Path(__file__).resolve().parents[2]


def _command(name: str) -> list[str]:
    """Service ``name``'s command under the override (docker-compose.yml's where the override has none)."""
    override = yaml.safe_load((ROOT / "docker" / "sentinel.compose.yml").read_text())["services"]
    base = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    return override.get(name, {}).get("command") or base[name]["command"]


def _run(argv: list[str], folder: Path) -> subprocess.Popen:
    """``argv`` started in ``folder`` (a container's working directory: its files), its redis-server on PATH."""
    folder.mkdir(exist_ok=True)
    env = {**os.environ, "PATH": f"{Path(redis_binary()).parent}:{os.environ['PATH']}"}
    with (folder / "log").open("ab") as log:
        return subprocess.Popen(argv, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)


def _server(name: str, port: int, master_port: int, folder: Path) -> subprocess.Popen:
    argv = [a if a != "6379" else str(master_port) for a in _command(name)]
    argv = [a if a != "redis" else "127.0.0.1" for a in argv]
    return _run([*argv, "--port", str(port), "--bind", "127.0.0.1"], folder)


def _stopped(*procs: subprocess.Popen) -> None:
    for proc in procs:
        proc.kill()
        proc.wait()


def _answers(client: redis.Redis) -> bool:
    try:
        return client.ping()
    except redis.RedisError:
        return False


def test_a_master_killed_and_restarted_at_once_keeps_its_data_and_its_replicas(tmp_path):
    """The restart policy starts a SIGKILLed ``redis`` again within a second, before any sentinel sees
    it down (5 s): no failover ("+reboot"), and without persistence it came back empty, and its
    replica copied the empty set: the header's promotion never came, and both lost every key."""
    master_port = consecutive_ports(2)
    master = _server("redis", master_port, master_port, tmp_path / "redis")
    replica = _server("redis-replica", master_port + 1, master_port, tmp_path / "redis-replica")
    try:
        m, r = redis.Redis(port=master_port), redis.Redis(port=master_port + 1)
        assert wait_until(lambda: _answers(m) and _answers(r), 10)
        m.set("kept", "yes")
        assert m.wait(1, 5000) == 1  # (the replica has it)
        master.send_signal(signal.SIGKILL)
        master.wait()
        master = _server("redis", master_port, master_port, tmp_path / "redis")
        assert wait_until(lambda: _answers(m), 10)
        assert wait_until(lambda: r.info("replication")["master_link_status"] == "up", 20)
        assert (m.get("kept"), r.get("kept")) == (b"yes", b"yes")
    finally:
        _stopped(master, replica)


def _sentinel(port: int, master_port: int, folder: Path) -> subprocess.Popen:
    shell, flag, script = _command("sentinel-1")
    script = script.replace("/tmp/sentinel.conf", str(folder / "sentinel.conf"))
    script = script.replace("port 26379", f"port {port}\\nbind 127.0.0.1")
    script = script.replace(" redis 6379 ", f" 127.0.0.1 {master_port} ")
    return _run([shell, flag, script], folder)


def test_a_sentinel_restarted_is_the_same_sentinel(tmp_path):
    """Its config was written anew at each start: a new ID each restart, and the other sentinels count
    each old one among the voters for ever (three restarts: no failover elected, "-failover-abort-not-elected")."""
    port = consecutive_ports(2)
    sentinel = _sentinel(port + 1, port, tmp_path)
    try:
        client = redis.Redis(port=port + 1, socket_timeout=2)
        assert wait_until(lambda: _answers(client), 10)
        first = client.execute_command("SENTINEL", "MYID")
        _stopped(sentinel)
        sentinel = _sentinel(port + 1, port, tmp_path)
        assert wait_until(lambda: _answers(client), 10)
        assert client.execute_command("SENTINEL", "MYID") == first
    finally:
        _stopped(sentinel)


def _healthy(sentinel_port: int) -> bool:
    """The sentinels' compose healthcheck, run as the container runs it (``$$`` is compose's ``$``)."""
    kind, *command = yaml.safe_load((ROOT / "docker" / "sentinel.compose.yml").read_text())["x-sentinel"][
        "healthcheck"
    ]["test"]
    command = [part.replace("$$", "$").replace("26379", str(sentinel_port)) for part in command]
    argv = ["sh", "-c", *command] if kind == "CMD-SHELL" else command
    env = {**os.environ, "PATH": f"{Path(redis_binary()).parent}:{os.environ['PATH']}"}
    return subprocess.run(argv, env=env, timeout=10, capture_output=True).returncode == 0


def test_a_sentinel_is_healthy_only_once_it_sees_its_master_up(tmp_path):
    """The check asked for the master's address, which a sentinel answers from its config before it
    reaches the master (exit 0 for none at all): healthy with no master up, and the services that wait
    on it started against sentinels that named none."""
    port = consecutive_ports(2)
    sentinel = _sentinel(port + 1, port, tmp_path / "sentinel")
    master = None
    try:
        client = redis.Redis(port=port + 1, socket_timeout=2)
        assert wait_until(lambda: _answers(client), 10)
        assert not _healthy(port + 1)
        master = _server("redis", port, port, tmp_path / "redis")
        assert wait_until(lambda: _healthy(port + 1), 15, step_s=0.5)
    finally:
        _stopped(sentinel, *([master] if master else []))
