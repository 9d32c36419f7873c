"""A sentinel that asks for a password (``requirepass`` in sentinel.conf): ``up``'s check of a
``redis+sentinel://`` URL whose ``sentinel_password`` the sentinel refuses. Real processes: a
master and a sentinel (the bundled redis-server)."""

from __future__ import annotations

import pytest

from dayzero.procs import consecutive_ports, redis_binary, spawn, start_redis
from dayzero.stack import StartFailed, _answering

from .conftest import wait_until

PASSWORD = "sentinel+secret"  # (a "+" in the URL's query is itself)


@pytest.fixture(scope="module")
def sentinel_port(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sentinel")
    master_port = consecutive_ports(2)
    port, procs = master_port + 1, []
    try:
        procs.append(start_redis(master_port, folder / "master.log"))
        conf = folder / "sentinel.conf"  # (the sentinel rewrites it: its own file)
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\nrequirepass {PASSWORD}\nsentinel monitor dz 127.0.0.1 {master_port} 1\n"
        )
        procs.append(spawn([redis_binary(), str(conf), "--sentinel"], folder / "sentinel.log"))
        url = f"redis+sentinel://127.0.0.1:{port}/dz/0?sentinel_password={PASSWORD}"
        assert wait_until(lambda: _answered(url), 10)
        yield port
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _answered(url: str) -> bool:
    try:
        _answering(url, 0)
    except StartFailed:
        return False
    return True


@pytest.mark.parametrize(
    ("query", "says"),
    [("?sentinel_password=wrong", "refuses sentinel_password"), ("", "refuses a client without sentinel_password")],
)
def test_a_refused_sentinel_password_ends_the_start_at_once_saying_so(sentinel_port, query, says):
    """It waited the whole bound (10 s in ``up``) as for a Redis down, then said the Redis "did not
    answer ...; start it": the sentinel answered, and refused the password (no wait mends that)."""
    url = f"redis+sentinel://127.0.0.1:{sentinel_port}/dz/0{query}"
    with pytest.raises(StartFailed) as failed:
        _answering(url, 5)
    said = str(failed.value)
    assert f"sentinel 127.0.0.1:{sentinel_port} {says}" in said and "did not answer" not in said, said
    assert "wrong" not in said  # (the password is starred)


def test_the_sentinels_password_taken_the_master_answers(sentinel_port):
    assert _answered(f"redis+sentinel://127.0.0.1:{sentinel_port}/dz/0?sentinel_password={PASSWORD}")
