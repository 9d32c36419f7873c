"""What a request's admission and its first read cost in Redis: the request serialized once (its
record and its queue message share the JSON), the response's read marked among the stream's
readers by the admission's own script (no ``Watching.watch`` round trip), and no wake-up for the
first reader of an idle gateway's stream hub (its read starts with the stream in it)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import threading
import time

import httpx
import redis
import redis.asyncio as aioredis

from dayzero.params import SamplingParams
from dayzero.serving.keys import key
from dayzero.serving.messages import GenerationRequest, PrefillJob
from dayzero.serving.queue import make_celery
from dayzero.serving.queue_scripts import ADMIT
from dayzero.serving.records import Token, encode
from dayzero.serving.watching import READERS
from dayzero.settings import Settings
from dayzero.telemetry import tracer
from services.gateway.bus import Bus
from services.gateway.streams import StreamHub

from .conftest import MODEL


def _request(rid: str) -> GenerationRequest:
    return GenerationRequest(request_id=rid, prompt_ids=(1, 2, 3), sampling=SamplingParams(max_tokens=2), created=1.0)


def test_admission_serializes_a_request_once_and_watches_its_read_in_the_same_step(redis_url, monkeypatch):
    """The record and the prefill message carry the same request (the message's job parses to the
    recorded request, its other fields at their defaults), serialized once (was: the request for the
    record, and again inside its PrefillJob for the message); the response's read is among the
    stream's readers as soon as the admission returns, for as long as the record lives."""
    dumps = {"request": 0, "job": 0}
    request_dump, job_dump = GenerationRequest.model_dump_json, PrefillJob.model_dump_json

    def counted(name, dump):
        def dump_counted(self, **kw):
            dumps[name] += 1
            return dump(self, **kw)

        return dump_counted

    monkeypatch.setattr(GenerationRequest, "model_dump_json", counted("request", request_dump))
    monkeypatch.setattr(PrefillJob, "model_dump_json", counted("job", job_dump))
    settings = Settings(redis_url=redis_url)
    r = redis.Redis.from_url(redis_url)
    r.delete("prefill")

    async def admit() -> bool:
        bus = Bus(settings, make_celery(settings))
        spans = [tracer.start_span("gateway.request") for _ in range(2)]
        try:
            return await bus.submit([_request("once-a"), _request("once-b")], spans, [], "owner", ["read-a", ""])
        finally:
            await bus.close()

    assert asyncio.run(admit())
    assert dumps == {"request": 2, "job": 0}
    messages = [json.loads(m) for m in reversed(r.lrange("prefill", 0, -1))]
    for rid, message in zip(("once-a", "once-b"), messages, strict=True):
        recorded = GenerationRequest.model_validate_json(r.get(key("req", rid)))
        payload = json.loads(base64.b64decode(message["body"]))[0][0]
        assert PrefillJob.model_validate_json(payload) == PrefillJob(request=recorded)
    assert r.smembers(key("watchers", "once-a")) == {b"read-a"}
    assert abs(r.ttl(key("watchers", "once-a")) - r.ttl(key("req", "once-a"))) <= 1
    assert not r.exists(key("watchers", "once-b"))  # (no read given: none marked)


def test_the_first_reader_of_an_idle_hub_sends_no_wake_up_and_a_later_one_is_woken(redis_url):
    """An idle gateway's hub starts its reader per request: that reader's first read has the new
    stream in it, so a wake-up (a round trip, and a read it ends at once) was spent for nothing. A
    reader that joins while the hub's read blocks (60 s) is still woken and read at once."""
    first, later = key("tokens", "idle-first"), key("tokens", "idle-later")

    async def scenario() -> tuple[int, str, str]:
        commands = aioredis.Redis.from_url(redis_url)
        hub = StreamHub(redis_url, commands, block_ms=60_000)
        await commands.xadd(first, encode(Token("idle-first", 0, 5, "a")), id="1-0")
        await commands.xadd(later, encode(Token("idle-later", 0, 6, "b")), id="1-0")
        async with asyncio.timeout(10), hub.subscribe("idle-first") as sub:
            got = await sub.next(5)
            woken_idle = await commands.exists(hub.wake_key)
            async with hub.subscribe("idle-later") as joined:
                came = await joined.next(5)
        await hub.close()
        await commands.aclose()
        return woken_idle, got.text, came.text

    assert asyncio.run(scenario()) == (0, "a", "b")


def _monitored(url: str, lines: list[dict], stop: threading.Event) -> None:
    with redis.Redis.from_url(url).monitor() as monitor:
        for command in monitor.listen():
            lines.append(command)
            if stop.is_set():
                return


def test_a_streamed_request_s_read_costs_the_gateway_one_readers_script_its_leave(stack):
    """Through a real stack, Redis's MONITOR: the READERS script (a read comes, a read leaves) runs
    once for a streamed completion, at its leave (was twice: the watch before the first read too),
    and the admission's script names the read it marks."""
    readers_sha, admit_sha = (hashlib.sha1(script.encode()).hexdigest() for script in (READERS, ADMIT))
    body = {"model": MODEL, "prompt": [0, 5, 6, 7], "max_tokens": 2, "stream": True, "ignore_eos": True}
    for _ in range(2):  # every script loaded (a script's first call is two: NOSCRIPT, then loaded and run)
        assert httpx.post(f"{stack.url}/v1/completions", json=body, timeout=60).status_code == 200
    lines, stop = [], threading.Event()
    watcher = threading.Thread(target=_monitored, args=(stack.redis_url, lines, stop), daemon=True)
    watcher.start()
    time.sleep(0.3)
    with httpx.stream("POST", f"{stack.url}/v1/completions", json=body, timeout=60) as answer:
        rid = answer.headers["x-request-id"]
        assert b"[DONE]" in b"".join(answer.iter_bytes())

    def scripts() -> list[str]:
        return [c["command"] for c in list(lines) if c["command"].startswith("EVALSHA") and rid in c["command"]]

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(readers_sha in c for c in scripts()):
        time.sleep(0.05)  # (the leave's unwatch runs in a task of its own after the stream ends)
    time.sleep(0.3)
    stop.set()
    redis.Redis.from_url(stack.redis_url).ping()  # (the monitor's loop sees ``stop``)
    watcher.join(5)
    ran = scripts()
    assert sum(readers_sha in c for c in ran) == 1, [c for c in ran if readers_sha in c]
    admitted = [c for c in ran if admit_sha in c]
    assert len(admitted) == 1 and key("watchers", rid) in admitted[0], admitted
