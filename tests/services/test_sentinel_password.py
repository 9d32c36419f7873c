"""A sentinel that asks for a password (``requirepass`` in sentinel.conf): ``up``'s check of a
``redis+sentinel://`` URL whose ``sentinel_password`` the sentinel refuses, and the clients of a
running stack when the sentinel is restarted with another password. Real processes: a master and a
sentinel (the bundled redis-server)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from kombu.exceptions import OperationalError

from dayzero.procs import consecutive_ports, free_port, redis_binary, spawn, start_redis
from dayzero.redis_clients import SentinelRefused, async_client, sync_client
from dayzero.serving.queue import make_celery
from dayzero.settings import Settings
from dayzero.stack_start import StartFailed, answering

from .conftest import wait_until

PASSWORD = "sentinel+secret"  # (a "+" in the URL's query is itself)


class PasswordSentinel:
    """A master and a sentinel on the next port that asks for ``password``; ``restart`` with another."""

    def __init__(self, folder: Path, password: str) -> None:
        self.folder, self.master_port = folder, consecutive_ports(2)
        self.port, self.sentinel = self.master_port + 1, None
        self.master = start_redis(self.master_port, folder / "master.log")
        self.restart(password)

    def url(self, password: str | None) -> str:
        query = "" if password is None else f"?sentinel_password={password}"
        return f"redis+sentinel://127.0.0.1:{self.port}/dz/0{query}"

    def restart(self, password: str) -> None:
        self.stop_sentinel()
        conf = self.folder / "sentinel.conf"  # (the sentinel rewrites it: its own file, written anew)
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\nrequirepass {password}\n"
            f"sentinel monitor dz 127.0.0.1 {self.master_port} 1\n"
        )
        self.sentinel = spawn([redis_binary(), str(conf), "--sentinel"], self.folder / "sentinel.log")
        assert wait_until(lambda: _answered(self.url(password)), 10)

    def stop_sentinel(self) -> None:
        if self.sentinel is not None:
            _stopped(self.sentinel)
            self.sentinel = None

    def stop(self) -> None:
        self.stop_sentinel()
        _stopped(self.master)


def _stopped(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


def _answered(url: str) -> bool:
    try:
        answering(url, 0)
    except StartFailed:
        return False
    return True


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory):
    group = PasswordSentinel(tmp_path_factory.mktemp("sentinel"), PASSWORD)
    try:
        yield group
    finally:
        group.stop()


@pytest.mark.parametrize(
    ("password", "says"), [("wrong", "refuses sentinel_password"), (None, "refuses a client without sentinel_password")]
)
def test_a_refused_sentinel_password_ends_the_start_at_once_saying_so(sentinel, password, says):
    """It waited the whole bound (10 s in ``up``) as for a Redis down, then said the Redis "did not
    answer ...; start it": the sentinel answered, and refused the password (no wait mends that)."""
    with pytest.raises(StartFailed) as failed:
        answering(sentinel.url(password), 5)
    said = str(failed.value)
    assert f"sentinel 127.0.0.1:{sentinel.port} {says}" in said and "did not answer" not in said, said
    assert "wrong" not in said  # (the password is starred)


def test_the_sentinels_password_taken_the_master_answers(sentinel):
    assert _answered(sentinel.url(PASSWORD))


def test_a_gateway_started_alone_ends_at_once_on_a_refused_sentinel_password(sentinel, tiny_checkpoint):
    """``dayzero serve gateway`` (compose's way) checks its Redis once before it serves: sentinels
    refusing ``sentinel_password`` are that Redis refusing it for good (exit 2, one line)."""
    env = {**os.environ, "DAYZERO_CHECKPOINT": str(tiny_checkpoint), "DAYZERO_PORT": str(free_port())}
    env["DAYZERO_REDIS_URL"] = sentinel.url("wrong")
    argv = [sys.executable, "-m", "dayzero.cli", "serve", "gateway"]
    try:  # (on the bound: killed by subprocess.run)
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    except subprocess.TimeoutExpired as served:
        pytest.fail(f"the gateway served: {served.stderr!r}")
    err = done.stderr.strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1, err
    assert f"sentinel 127.0.0.1:{sentinel.port} refuses sentinel_password" in err and "wrong" not in err, err


async def _gateways_client_refused_after(url: str, restart: Callable[[], None]) -> None:
    aio = async_client(url, socket_timeout=2)
    try:
        assert await aio.ping()
        restart()
        await aio.connection_pool.disconnect()  # (a failover, a lost connection: the next asks the sentinel)
        with pytest.raises(SentinelRefused):
            await aio.ping()
    finally:
        await aio.aclose()


def test_a_sentinel_restarted_with_another_password_is_refused_credentials_not_an_outage(tmp_path):
    """A running stack's clients, their sentinel restarted with another ``requirepass``: each new
    connection's question went unanswered (redis-py's MasterNotFoundError, a lost connection), an
    outage retried for ever (the workers' consumers, "unreachable" in /ready). Now credentials
    refused (an AuthenticationError): the consumer's bound then its exit (reconnect.py), /ready's
    "refuses DAYZERO_REDIS_URL's credentials"."""
    group = PasswordSentinel(tmp_path, "before")
    url = group.url("before")
    client = sync_client(url, socket_timeout=2)
    consumer = make_celery(Settings(redis_url=url)).connection_for_write()
    try:
        assert client.ping()
        consumer.ensure_connection(max_retries=1)
        asyncio.run(_gateways_client_refused_after(url, lambda: group.restart("after")))
        client.connection_pool.disconnect()
        with pytest.raises(redis.AuthenticationError, match=f"sentinel 127.0.0.1:{group.port} refuses sentinel_"):
            client.ping()
        consumer.close()
        with pytest.raises(OperationalError) as lost:
            consumer.ensure_connection(max_retries=0)
        assert isinstance(lost.value.__cause__ or lost.value.__context__, redis.AuthenticationError), lost.value
    finally:
        client.close()
        consumer.release()
        group.stop()


def test_a_refusing_sentinel_beside_an_unreachable_one_is_an_outage_not_a_refusal(sentinel):
    """The URL's other sentinel unreachable (a partition, its restart) may well take the URL's
    ``sentinel_password``; the answering one's refusal alone was said as the credentials refused: a
    worker cut from its sentinels but the one misconfigured exited after DAYZERO_CREDENTIALS_REFUSED_S
    (its weights loaded again) in an outage that the network's return mends."""
    unreachable = free_port()
    url = f"redis+sentinel://127.0.0.1:{unreachable},127.0.0.1:{sentinel.port}/dz/0?sentinel_password=other"
    client = sync_client(url, socket_timeout=2)
    try:
        with pytest.raises(redis.ConnectionError) as lost:
            client.ping()
        assert not isinstance(lost.value, redis.AuthenticationError), lost.value
    finally:
        client.close()
