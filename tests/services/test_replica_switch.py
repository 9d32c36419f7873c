"""A Redis switched to a replica (``REPLICAOF``: a failover's old master) answers every blocked
client ``UNBLOCKED`` and closes its connection, and goes on answering reads. The gateway's hub took
its ended XREAD for a lost Redis and ended every open stream (``queue_unavailable``); Celery took
its consumer's ended BRPOP for an unrecoverable error and the worker exited. Now the hub reads again
and the consumer reconnects. Real Redis, real gateway and worker processes."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import httpx
import redis
import redis.asyncio as aioredis

from dayzero.procs import free_port
from dayzero.serving.keys import key
from dayzero.serving.records import Token, encode
from services.gateway.streams import StreamHub

from .conftest import MODEL, sse_events, start_stack, wait_until


def blocked(client: redis.Redis, command: str) -> int:
    """How many clients are blocked in ``command`` now."""
    return sum(c.get("cmd") == command and "b" in c.get("flags", "") for c in client.client_list())


@contextlib.contextmanager
def demoted(client: redis.Redis):
    """Redis a replica while inside (of a master nobody answers on: it refuses writes, answers reads)."""
    client.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
    try:
        yield
    finally:
        client.execute_command("REPLICAOF", "NO", "ONE")


def test_a_stream_read_while_redis_becomes_a_replica_goes_on(redis_url):
    stream, sync = key("tokens", "r"), redis.Redis.from_url(redis_url)

    async def scenario() -> tuple:
        commands = aioredis.Redis.from_url(redis_url)
        hub = StreamHub(redis_url, commands, block_ms=200)
        await commands.xadd(stream, encode(Token("r", 0, 5, "a")), id="1-0")
        async with hub.subscribe("r") as sub:
            first = await sub.next(5)
            assert await asyncio.to_thread(wait_until, lambda: blocked(sync, "xread") == 1, 10)
            with demoted(sync):
                during = [await sub.next(0.5) for _ in range(3)]  # (was: ConnectionError at once)
            await commands.xadd(stream, encode(Token("r", 1, 6, "b", finish_reason="length")), id="2-0")
            last = await sub.next(5)
        await hub.close()
        await commands.aclose()
        return first, during, last

    first, during, last = asyncio.run(scenario())
    assert first.text == "a" and during == [None] * 3
    assert (last.text, last.finish_reason) == ("b", "length")


def _stream(url: str, body: dict, seen: list, started: threading.Event) -> None:
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        for _, data in sse_events(response):
            seen.append(data)
            started.set()
            if data == "[DONE]":
                return


def test_workers_and_streams_go_on_through_a_switch_to_a_replica_and_back(text_dir, tmp_path):
    stack = start_stack(text_dir, tmp_path, {"vision": 0, "prefill": 1, "decode": 1})
    r = redis.Redis.from_url(stack.redis_url)
    workers = [stack.child(name) for name in ("prefill0", "decode0")]
    body = {"model": MODEL, "prompt": [0, 5, 6], "max_tokens": 300, "ignore_eos": True, "stream": True}
    seen, started = [], threading.Event()
    try:
        reader = threading.Thread(target=_stream, args=(stack.url, body, seen, started))
        reader.start()
        assert started.wait(60)
        assert wait_until(lambda: blocked(r, "brpop") >= 2, 30)  # both consumers idle in their BRPOP
        pids = [w.proc.pid for w in workers]
        with demoted(r):
            assert wait_until(lambda: blocked(r, "brpop") == 0, 10)  # every BRPOP ended (UNBLOCKED)
            assert not wait_until(lambda: any(w.proc.poll() is not None for w in workers), 3)
        reader.join(120)
        assert seen[-1] == "[DONE]" and "error" not in seen[-2], seen[-3:]  # (was: queue_unavailable)
        assert [w.proc.pid for w in workers] == pids and all(w.proc.poll() is None for w in workers)
        answer = httpx.post(f"{stack.url}/v1/completions", json={**body, "stream": False, "max_tokens": 4}, timeout=60)
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4
        for name in ("prefill0", "decode0"):  # (was: "Unrecoverable error", the process ended)
            assert "Unrecoverable error" not in (tmp_path / f"{name}.log").read_text(errors="replace")
    finally:
        stack.stop()
