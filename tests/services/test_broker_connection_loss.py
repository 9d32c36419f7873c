"""A worker's broker connection lost while it runs requests (``CLIENT KILL``: a network blip, a
proxy restarting): Celery reconnects in ~0.1 s and its tasks go on running them. kombu put their
delivered, unacknowledged messages back on the queue as the channel closed (``Restoring 4
unacknowledged message(s)``) and the worker claimed them again, its own lease: long prompts were
prefilled twice (4 prompts of 2,500 tokens: 17,500 tokens prefilled, not 10,000). Now they stay with
their tasks: each prompt is prefilled once, each stream is the same as without the loss; and the
worker, reconnected, takes a message only while one of its threads is free. Real Redis, gateway and
worker processes; kombu's channel over dayzero's transport."""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import threading

import httpx
import pytest
import redis
from celery import Celery
from kombu import Connection

from dayzero.serving import broker
from dayzero.serving.keys import key

from .conftest import MODEL, start_stack, stream_text, wait_until
from .test_broker_refusals import _consume_from
from .test_decode_appends import writes_refused

LONG_PROMPT = [(7 * j) % 200 + 3 for j in range(2500)]  # prefilled over several steps (chunks)


def kill_broker_connections(r: redis.Redis) -> int:
    """Close every worker's broker connection (``queue_reads.QueueReads`` names them): how many."""
    named = [c for c in r.client_list() if c.get("name", "").startswith("dayzero-reads-")]
    for client in named:
        r.execute_command("CLIENT", "KILL", "ID", client["id"])
    return len(named)


def counted(r: redis.Redis, stage: str) -> tuple[float, float]:
    """The stage's one worker's tokens counted (prefill: prompt tokens consumed) and its last batch's
    size, from the snapshot it publishes with its heartbeat."""
    (usage,) = [json.loads(r.get(k)) for k in r.scan_iter(key("usage", f"{stage}*"))]
    return usage["counters"].get("tokens", 0.0), usage["gauges"].get("batch_size", 0.0)


def idle_at(r: redis.Redis, stage: str, tokens: float) -> float | None:
    """The stage's tokens counted once they reach ``tokens`` with nothing in its batch; else None."""
    count, batch = counted(r, stage)
    return count if count >= tokens and batch == 0 else None


def leased_to(r: redis.Redis, stage: str) -> int:
    """How many requests workers of ``stage`` have claimed (their tasks' messages delivered, unacknowledged)."""
    return sum((r.get(k) or b"").startswith(stage.encode()) for k in r.scan_iter(key("lease", "*")))


def named_reads(r: redis.Redis) -> set[str]:
    """The names of the workers' broker connections (``queue_reads.QueueReads``)."""
    return {c["name"] for c in r.client_list() if c.get("name", "").startswith("dayzero-reads-")}


def sent(url: str, body: dict) -> None:
    """A request whose answer nobody reads (the stack may stop under it)."""
    with contextlib.suppress(httpx.HTTPError):
        httpx.post(url, json=body, timeout=300)


def test_requests_under_way_when_the_broker_connection_is_lost_are_run_once(text_dir, tmp_path):
    stack = start_stack(text_dir, tmp_path, {"vision": 0, "prefill": 1, "decode": 1})
    r, url = redis.Redis.from_url(stack.redis_url), f"{stack.url}/v1/completions"
    long = {"model": MODEL, "prompt": LONG_PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    short = {"model": MODEL, "prompt": [0, 5, 6], "max_tokens": 200, "temperature": 0, "ignore_eos": True}
    prompts, completions = len(long["prompt"]) + len(short["prompt"]), 7 + 199  # (decode: all but the first token)
    try:
        references = {name: stream_text(url, body)[0] for name, body in (("long", long), ("short", short))}
        assert wait_until(lambda: idle_at(r, "prefill", prompts) and idle_at(r, "decode", completions), 30)
        got = {}
        for name, body, stage in (("long", long, "prefill"), ("short", short, "decode")):
            reader = threading.Thread(target=lambda name=name, body=body: got.update({name: stream_text(url, body)}))
            reader.start()
            assert wait_until(lambda stage=stage: leased_to(r, stage), 60)
            assert kill_broker_connections(r) >= 2  # every worker's: Celery reconnects
            reader.join(120)
        for name, reference in references.items():
            text, _, final, _ = got[name]
            assert text == reference and final["choices"][0]["finish_reason"] == "length", name
        # each prompt prefilled once (was: the long one twice), each completion decoded once
        assert wait_until(lambda: idle_at(r, "prefill", 2 * prompts), 30) == 2 * prompts
        assert wait_until(lambda: idle_at(r, "decode", 2 * completions), 30) == 2 * completions
    finally:
        stack.stop()


@pytest.mark.parametrize("writes", [contextlib.nullcontext, writes_refused], ids=["taken", "refused"])
def test_a_closing_channel_puts_no_delivered_message_back(redis_url, monkeypatch, tmp_path, caplog, writes):
    """kombu's restore at a channel's close (a lost connection) is off: the message stays its task's,
    with Redis taking writes (was: back on its queue, delivered again) or refusing them (was: dumped
    into a file of the temporary directory, a request's prompt among it, that nothing read or removed)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    caplog.set_level(logging.INFO, logger=broker.log.name)
    r = redis.Redis.from_url(redis_url)
    channel = Connection(redis_url, transport=broker.Transport, transport_options={"ack_emulation": False}).channel()
    try:
        _consume_from(channel, "closing")
        channel.basic_publish(channel.prepare_message("a prompt"), exchange="closing", routing_key="closing")
        assert channel.basic_get("closing", no_ack=False) is not None  # delivered, not acked
        with writes(r):
            channel.close()
        assert r.llen("closing") == 0  # (taken, was: 1)
    finally:
        channel.close()
        r.delete("closing", "_kombu.binding.closing")
    assert list(tmp_path.iterdir()) == []  # (refused, was: a dump file)
    assert "1 delivered message(s) stay with the tasks running them" in caplog.text


def test_a_worker_whose_every_thread_is_busy_takes_no_message_after_a_reconnect(text_dir, tmp_path):
    """A decode worker of 2 threads (DAYZERO_MAX_BATCH=1: 2 tasks) runs 2 long requests when its
    broker connection is lost. Its new channel counted no delivery (the lost one's stay with their
    tasks) and Celery lowers no prefetch after a reconnect on Redis (per-consumer QoS): it took the
    next request's message at once, to wait unstarted for one of its threads while a peer could have
    run it. It now takes a message only while a thread is free: the message waits on the queue."""
    # (handoffs through Redis: prefill keeps no blocks of the handoff waiting here, and takes the next prompt)
    extra = {"DAYZERO_MAX_BATCH": "1", "DAYZERO_MAX_TOKENS_LIMIT": "4000", "DAYZERO_HANDOFF": "redis"}
    stack = start_stack(text_dir, tmp_path, {"vision": 0, "prefill": 1, "decode": 1}, extra)
    r, url = redis.Redis.from_url(stack.redis_url), f"{stack.url}/v1/completions"
    long = {"model": MODEL, "prompt": [0, 5, 6], "max_tokens": 4000, "ignore_eos": True}
    app = Celery(broker=stack.redis_url)
    try:
        for _ in range(2):
            threading.Thread(target=sent, args=(url, long), daemon=True).start()
        assert wait_until(lambda: leased_to(r, "decode") == 2, 60)  # one decoding, one waiting: every thread
        workers = named_reads(r)
        assert kill_broker_connections(r) >= 2
        assert wait_until(lambda: named_reads(r) == workers, 30)  # Celery connected again
        threading.Thread(target=sent, args=(url, {**long, "max_tokens": 2}), daemon=True).start()
        assert wait_until(lambda: r.llen("decode") == 1, 60)  # its message waits (was: taken at once)
        for _ in range(2):  # the worker's event loop has turned since (it answers between its reads)
            reserved = app.control.inspect(timeout=30, limit=2).reserved()
        (unstarted,) = [tasks for worker, tasks in reserved.items() if worker.startswith("decode0@")]
        assert r.llen("decode") == 1 and unstarted == []
        assert leased_to(r, "decode") == 2  # (the long ones still ran)
    finally:
        stack.stop()
