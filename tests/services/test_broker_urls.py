"""The broker transport of each Redis URL dayzero serves with. A ``rediss://`` URL (TLS) kept kombu's
own transport: a switch to a replica (``UNBLOCKED``) ended a worker's consumer as an unrecoverable
error, as ``redis://`` did before broker.py. Now both get dayzero's, TLS kept (kombu, given a
transport, connected to ``rediss://`` without TLS unless told). The bundled redis-server has no TLS:
a real one serves behind a TLS-terminating forwarder with a certificate made by ``openssl``."""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import subprocess
import threading

import pytest
import redis

from dayzero.serving import broker
from dayzero.serving.queue import make_celery
from dayzero.settings import Settings

from .conftest import wait_until
from .test_broker_refusals import _consume_from
from .test_replica_switch import blocked, demoted


@pytest.mark.parametrize(
    ("url", "ssl_options"),
    [
        ("redis://127.0.0.1:6379/0", False),
        ("rediss://127.0.0.1:6380/0", {"ssl_cert_reqs": ssl.CERT_REQUIRED}),  # (as redis-py's own clients)
        ("rediss://127.0.0.1:6380/0?ssl_cert_reqs=none", {"ssl_cert_reqs": ssl.CERT_NONE}),
    ],
)
def test_each_redis_url_gets_dayzeros_transport(url, ssl_options):
    connection = make_celery(Settings(redis_url=url)).connection_for_write()
    assert connection.transport_cls == broker.TRANSPORT and connection.ssl == ssl_options


def _pump(source: socket.socket, target: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            target.sendall(data)
    for end in (source, target):
        with contextlib.suppress(OSError):
            end.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def tls_in_front_of(port: int, folder):
    """A TLS port forwarding to the Redis on ``port``: (its port, the CA file that checks it)."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = listener.accept()
                try:
                    secured = context.wrap_socket(client, server_side=True)
                except (OSError, ssl.SSLError):
                    continue
                upstream = socket.create_connection(("127.0.0.1", port))
                for ends in ((secured, upstream), (upstream, secured)):
                    threading.Thread(target=_pump, args=ends, daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1], cert
    finally:
        listener.close()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="makes its certificate with openssl")
def test_a_rediss_consumer_takes_a_switch_to_a_replica_for_a_lost_connection(redis_url, tmp_path):
    r = redis.Redis.from_url(redis_url)
    with tls_in_front_of(r.connection_pool.connection_kwargs["port"], tmp_path) as (port, ca):
        settings = Settings(redis_url=f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}")
        with make_celery(settings).connection_for_write() as connection:
            channel = connection.channel()
            _consume_from(channel, "over-tls")  # (over TLS, the certificate checked)
            ended = []

            def consume() -> None:
                try:
                    channel.client.brpop(["over-tls"], timeout=30)
                except redis.RedisError as exc:
                    ended.append(exc)

            consumer = threading.Thread(target=consume)
            consumer.start()
            assert wait_until(lambda: blocked(r, "brpop") == 1, 10)
            with demoted(r):
                consumer.join(10)
            assert isinstance(ended[0], redis.ConnectionError), ended  # (was: ResponseError, "Unrecoverable")
            channel.close()
    r.delete("_kombu.binding.over-tls")
