"""The one Redis URL parser: redis://, rediss:// and redis+sentinel:// URLs, what each becomes."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import redis
from kombu import Connection
from kombu.utils.url import parse_url
from pydantic import ValidationError

from dayzero.procs import free_port
from dayzero.redis_clients import async_client, sync_client, unreached
from dayzero.redis_urls import SentinelAddress, query_keys_taken, sentinel_address, without_password
from dayzero.serving import broker
from dayzero.serving.queue import make_celery
from dayzero.settings import Settings
from dayzero.settings_help import settings_from_env
from services.gateway.readiness import readiness


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://127.0.0.1:6379/0", None),
        ("rediss://h:6380/1?ssl_cert_reqs=none", None),
        ("redis+sentinel://s1/mymaster", SentinelAddress((("s1", 26379),), "mymaster")),
        (
            "redis+sentinel://app:p%40ss@s1:26380,s2,[::1]:26381/mymaster/3?sentinel_password=sp",
            SentinelAddress((("s1", 26380), ("s2", 26379), ("::1", 26381)), "mymaster", 3, "app", "p@ss", "sp"),
        ),
        ("redis+sentinel://:pw@s1/m", SentinelAddress((("s1", 26379),), "m", password="pw")),
    ],
)
def test_a_url_names_its_sentinels_and_master(url, expected):
    assert sentinel_address(url) == expected


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sentinel://s1:26379;sentinel://s2:26379", "kombu's form"),
        ("unix:///tmp/redis.sock", "redis+sentinel://"),
        ("redis+sentinel://s1", "names its sentinels and its master"),
        ("redis+sentinel://s1/m/x", "names its sentinels and its master"),
        ("redis+sentinel://s1:port/m", "host[:port], not 's1:port'"),
        ("redis+sentinel://s1/m?ssl=true", "not ssl"),
    ],
)
def test_another_url_is_refused_at_start_naming_the_form(url, says):
    with pytest.raises(ValueError, match="redis_url") as refused:
        Settings(redis_url=url)
    assert says in str(refused.value)


def test_passwords_are_starred_where_shown():
    url = "redis+sentinel://app:secret@s1,s2/m/0?sentinel_password=other"
    assert without_password(url) == "redis+sentinel://app:***@s1,s2/m/0?sentinel_password=***"
    assert without_password("redis://:secret@h:6379/0") == "redis://:***@h:6379/0"


@pytest.mark.parametrize(
    "url",
    [
        "redis://:top/secret@h:6379/0",
        "redis://app:top?secret@h:6379/0",
        "redis://:top#secret@h:6379/0",
        "redis+sentinel://:top/secret@s1:26379/m/0",
        "redis://:top?se=cret@h:6379/0",  # (taken: "Port could not be cast to integer value as 'top'")
        "redis://app:1234?se=cret@h:6379/0",  # (taken: "unexpected keyword argument 'se'", a traceback)
    ],
)
def test_a_password_that_cuts_its_url_short_is_refused_at_start_and_starred(monkeypatch, url):
    """A raw / (or ? or #) in the password ends the URL's host there: redis-py refused it with "Port
    could not be cast to integer value as 'top'", part of the password, and the starred URL showed
    the rest ("redis://:***@..." kept "/secret@h")."""
    assert "top" not in without_password(url) and "secret" not in without_password(url)
    monkeypatch.setenv("DAYZERO_REDIS_URL", url)
    with pytest.raises(ValueError, match="percent-encode them") as refused:
        settings_from_env()
    assert "top" not in str(refused.value) and "secret" not in str(refused.value)


def test_an_at_sign_after_the_host_is_no_cut_password():
    """(a sentinel_password may hold an @; a password with one, redis-py reads to the last @)"""
    assert Settings(redis_url="redis+sentinel://s1/m/0?sentinel_password=a@b").redis_url.endswith("a@b")
    assert without_password("redis://:top@secret@h:6379/0") == "redis://:***@h:6379/0"
    shown = "redis+sentinel://s1:26379/m/0?sentinel_username=ops@corp&sentinel_password=***"  # (was: "s1:***@corp")
    assert without_password("redis+sentinel://s1:26379/m/0?sentinel_username=ops@corp&sentinel_password=x") == shown
    assert (
        without_password("redis+sentinel://:a/b@s1/m?sentinel_username=o@c")
        == "redis+sentinel://:***@s1/m?sentinel_username=o@c"
    )


def test_an_at_sign_in_a_plain_urls_query_value_is_no_cut_password():
    """An @ in a query value (``?client_name=app@web``) was refused as a cut password; it is a key the
    broker does not take, and said so."""
    with pytest.raises(ValidationError, match=r"query takes ssl_\* keys \(TLS\) alone, not client_name: Celery"):
        Settings(redis_url="redis://127.0.0.1:6379/0?client_name=app@web")


# redis-py 8.2's: its URL parser's (URL_QUERY_ARGUMENT_PARSERS), its connections' keywords
# (AbstractConnection's, SSLConnection's), and the sentinel URL's own two
URL_QUERY_KEYS_TAKEN = {
    *("db", "health_check_interval", "legacy_responses", "max_connections", "protocol", "retry_on_error"),
    *("retry_on_timeout", "socket_connect_timeout", "socket_keepalive", "socket_read_size", "socket_timeout"),
    "timeout",
    *("password", "username", "client_name", "lib_name", "lib_version", "driver_info", "credential_provider"),
    *("encoding", "encoding_errors", "decode_responses", "parser_class", "retry", "redis_connect_func"),
    *("command_packer", "event_dispatcher", "himport_registry", "orig_host_address", "orig_socket_timeout"),
    *("orig_socket_connect_timeout", "maint_notifications_config", "maint_notifications_pool_handler"),
    *("maintenance_state", "maintenance_notification_hash", "oss_cluster_maint_notifications_handler"),
    *("ssl_keyfile", "ssl_certfile", "ssl_cert_reqs", "ssl_include_verify_flags", "ssl_exclude_verify_flags"),
    *("ssl_ca_certs", "ssl_ca_data", "ssl_check_hostname", "ssl_ca_path", "ssl_password", "ssl_validate_ocsp"),
    *("ssl_validate_ocsp_stapled", "ssl_ocsp_context", "ssl_ocsp_expected_cert", "ssl_min_version", "ssl_ciphers"),
    *("sentinel_password", "sentinel_username"),
}


def test_the_query_keys_a_url_takes_are_redis_py_8_2s():
    """The keys whose value may hold an @ (not a cut password's) are read from redis-py's signatures
    (at the first URL whose query holds an @): an upgrade that adds or drops one changes which URLs
    start. It shows here first."""
    added, dropped = (
        sorted(query_keys_taken() - URL_QUERY_KEYS_TAKEN),
        sorted(URL_QUERY_KEYS_TAKEN - query_keys_taken()),
    )
    assert not added and not dropped, (
        f"redis-py {redis.__version__} changed the query keys a Redis URL takes: added {added}, dropped {dropped}; "
        "check what each does in a URL (redis_urls._userinfo_cut, Settings' refusals), then update this list"
    )


@pytest.mark.parametrize(
    ("query", "taken"),
    [("client_name=app", False), ("socket_timeout=1", False), ("db=1", False), ("ssl_cert_reqs=required", True)],
)
def test_a_plain_urls_query_keys_are_those_the_broker_takes(query, taken):
    """redis-py takes ``client_name``, ``socket_timeout``...; kombu (the workers' Celery broker) fails
    on each with a TypeError at every connection: the URL passed the settings and each worker's start
    failed. Those kombu takes (its ssl options) are taken, the others refused at the settings."""
    url = f"rediss://127.0.0.1:6379/0?{query}"
    try:
        Connection(url)
    except TypeError:
        assert not taken
    else:
        assert taken
    if taken:
        assert Settings(redis_url=url).redis_url == url
    else:
        with pytest.raises(ValidationError, match=f"alone, not {query.partition('=')[0]}: Celery's broker"):
            Settings(redis_url=url)


@pytest.mark.parametrize("url", ["redis://h:6379/0?db=1&password=secret", "redis+sentinel://s1/m?password=secret"])
def test_a_password_in_the_query_is_refused_at_start_and_starred(monkeypatch, url):
    """redis-py takes ``?password=`` as the URL's password (``Redis.from_url``), and kombu, Celery's
    broker, fails on it (TypeError: dict() got multiple values for keyword argument 'password'): a
    redis:// one was taken at start, the workers' brokers failed. Refused, naming the userinfo form;
    the password starred (``up``'s "starting:" line and a refused URL's message printed it as given)."""
    assert redis.connection.parse_url("redis://h:6379/0?password=secret")["password"] == "secret"
    assert without_password(url).endswith("password=***")
    monkeypatch.setenv("DAYZERO_REDIS_URL", url)
    with pytest.raises(ValueError, match="password") as refused:
        settings_from_env()
    assert "secret" not in str(refused.value) and "password=***" in str(refused.value)


def test_the_broker_gets_kombus_sentinel_form_with_the_master_named():
    url = "redis+sentinel://:pw@127.0.0.1:26379,127.0.0.2:26390/mymaster/2?sentinel_password=sp"
    connection = make_celery(Settings(redis_url=url)).connection_for_write()
    assert connection.transport_cls == broker.SENTINEL
    assert connection.alt == ["sentinel://:pw@127.0.0.1:26379/2", "sentinel://127.0.0.2:26390"]
    assert (connection.password, connection.virtual_host) == ("pw", "2")
    options = connection.transport_options
    assert options["master_name"] == "mymaster" and options["sentinel_kwargs"]["password"] == "sp"
    assert options["ack_emulation"] is False  # (make_celery's own options kept beside)


def test_sentinels_that_name_no_master_are_one_short_line():
    """redis-py's MasterNotFoundError repeats each sentinel client's repr (~1,500 characters)."""
    closed = free_port()
    url = f"redis+sentinel://:pw@127.0.0.1:{closed}/dz/0"
    with pytest.raises(redis.RedisError) as failed:
        sync_client(url, socket_connect_timeout=1).ping()
    said = unreached(url, failed.value)
    assert said.startswith(f"no sentinel (127.0.0.1:{closed}) named the master 'dz': Error 111") and len(said) < 120


@pytest.mark.parametrize(
    ("url", "sentinels", "user", "password"),
    [  # a password with "/" (percent-encoded, as a URL's must be), an IPv6 sentinel
        ("redis+sentinel://:p%2Fw%3Fx%40@s1:26379,s2:26390/m/2", [("s1", 26379), ("s2", 26390)], None, "p/w?x@"),
        ("redis+sentinel://app:pw@[::1]:26379,[fe80::2]/m/2", [("::1", 26379), ("fe80::2", 26379)], "app", "pw"),
    ],
)
def test_the_broker_reaches_the_sentinels_with_the_masters_password(url, sentinels, user, password):
    """The broker's kombu URL was built with the password percent-encoded but for "/", and an IPv6
    sentinel unbracketed: kombu could not parse it ("Port could not be cast to integer value"), the
    gateway's enqueue and every worker's start failed on a URL settings.py took."""
    connection = make_celery(Settings(redis_url=url)).connection_for_write()
    asked = [parse_url(alt) for alt in connection.alt]  # (kombu's own parse, as its sentinel channel's)
    assert [(each["hostname"], each["port"]) for each in asked] == sentinels
    assert (connection.userid, connection.password, connection.virtual_host) == (user, password, "2")


def test_ready_names_the_sentinels_that_named_no_master_in_one_line():
    """``/ready``'s reason was redis-py's asyncio MasterNotFoundError text (each sentinel client's
    repr, ~1,100 characters): ``unreached`` shortened the sync client's alone (a class of its own)."""
    closed = free_port()
    url = f"redis+sentinel://127.0.0.1:{closed}/dz/0"
    gw = SimpleNamespace(
        settings=SimpleNamespace(redis_url=url), bus=SimpleNamespace(r=async_client(url)), command_refused=None
    )
    body, status = asyncio.run(readiness(gw))
    expected = f"redis unreachable: no sentinel (127.0.0.1:{closed}) named the master 'dz': Error 111"
    assert status == 503 and body["reason"].startswith(expected) and len(body["reason"]) < 200, body


def test_a_plus_in_the_sentinel_password_is_itself_and_a_sentinel_user_is_taken():
    """``parse_qs`` read the query: ``sentinel_password=a+b`` became ``"a b"`` (the sentinel refused
    it), and ``sentinel_username`` was refused as an unknown key (an ACL user's sentinels)."""
    url = "redis+sentinel://s1/m?sentinel_password=a+b%2Bc&sentinel_username=watcher"
    where = sentinel_address(url)
    assert (where.sentinel_password, where.sentinel_username) == ("a+b+c", "watcher")
    assert where.sentinel_kwargs()["username"] == "watcher" and where.sentinel_kwargs()["password"] == "a+b+c"
    options = make_celery(Settings(redis_url=url)).connection_for_write().transport_options
    assert options["sentinel_kwargs"]["username"] == "watcher"
