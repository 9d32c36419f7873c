"""A request that ended while its stream's end could not be written (``Settled.UNCLOSED``: SETTLE
recorded ``done`` but Redis refused the end's XADD) against a real Redis and a real gateway: its
client gets the end ``done`` names instead of keep-alives until it gives up. Here Redis refuses
because the settling stage's Redis user is denied XADD (a stage that streams no tokens, such as
vision, set up without it); the test plays that stage through the real ``Lifecycle``."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from dayzero.serving.keys import key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.reaper import no_worker_message
from dayzero.serving.records import Token, encode
from dayzero.serving.stream_scripts import Settled
from services.gateway.streams import StreamHub

from .conftest import MODEL, start_gateway_alone, wait_until

BODY = {"model": MODEL, "prompt": [0, 5, 6], "max_tokens": 50}
NO_WORKER = no_worker_message("decode", 11, 10)  # the reaper's no_worker end
GIVE_UP_S = 30.0  # the client's patience: without the gateway's look at ``done`` it waits this long, for nothing


@pytest.fixture(scope="module")
def gateway(text_dir, tmp_path_factory):
    """A gateway alone (nothing takes its requests: the test is the stage that ends them)."""
    stack = start_gateway_alone(text_dir, tmp_path_factory.mktemp("logs"), {"DAYZERO_NO_WORKER_TIMEOUT_S": "600"})
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def stages(gateway) -> tuple[Lifecycle, Lifecycle]:
    """Two stages' lifecycles: one that streams tokens, one whose Redis user may not XADD."""
    r = redis.Redis.from_url(gateway.redis_url)
    r.acl_setuser("no-xadd", enabled=True, passwords=["+pw"], commands=["+@all", "-xadd"], keys=["*"])
    address = urlsplit(gateway.redis_url)
    refused = Lifecycle.connect(f"redis://no-xadd:pw@{address.netloc}{address.path}")
    return Lifecycle.connect(gateway.redis_url), refused


class Client(threading.Thread):
    """A client's request (streamed: its events until ``[DONE]``; else its body), given up after
    GIVE_UP_S (keep-alives keep a stream's connection busy: no read timeout ends it)."""

    def __init__(self, gateway, stream: bool) -> None:
        super().__init__(daemon=True)
        self.url, self.stream = f"{gateway.url}/v1/completions", stream
        self.rid, self.status, self.events, self.body = None, None, [], None
        self.admitted, self.waited_s = threading.Event(), None

    def run(self) -> None:
        started = time.monotonic()
        try:
            with httpx.stream("POST", self.url, json={**BODY, "stream": self.stream}, timeout=GIVE_UP_S) as r:
                self.rid, self.status = r.headers.get("x-request-id"), r.status_code
                self.admitted.set()
                if self.stream:
                    self._read_events(r, started)
                else:
                    self.body = json.loads(r.read())
        except httpx.ReadTimeout:
            pass
        finally:
            self.waited_s = time.monotonic() - started
            self.admitted.set()

    def _read_events(self, response: httpx.Response, started: float) -> None:
        for line in response.iter_lines():
            if line.startswith("data:"):
                data = line[5:].strip()
                self.events.append(data if data == "[DONE]" else json.loads(data))
                if data == "[DONE]":
                    return
            if time.monotonic() - started > GIVE_UP_S:
                return


def _admitted_rid(gateway, client: Client) -> str:
    """The id of ``client``'s request once the gateway reads its stream (a body's reader too)."""
    r = redis.Redis.from_url(gateway.redis_url)
    if client.stream:
        assert client.admitted.wait(30) and client.rid, client.status
        rid = client.rid
    else:  # a body's headers come with it: its request is the only one not ended
        rid = wait_until(lambda: next((m.decode() for m in r.smembers(key("active"))), None), 30)
    assert wait_until(lambda: r.exists(key("watchers", rid)), 30)
    return rid


def _ended_unclosed(
    gateway, stages, reason: str, tokens: int = 0, stream: bool = True, code: str = "", usage: dict | None = None
) -> Client:
    """A client's request that ends ``reason`` (an error's ``code``, a finish's ``usage``) after
    ``tokens`` tokens without its stream's end: the client, once it has its answer or gave up."""
    client = Client(gateway, stream=stream)
    client.start()
    rid, (streaming, refused) = _admitted_rid(gateway, client), stages
    if tokens:
        streaming.append([Token(rid, i, 5 + i, f"t{i}") for i in range(tokens)], {rid: 0}, "decode-1")
    message = (NO_WORKER if code else "the image could not be decoded") if reason == "error" else ""
    assert refused.settle(rid, 0, "stage-1", reason, tokens, message, usage, code) == Settled.UNCLOSED
    assert streaming.done(rid) == reason
    client.join(GIVE_UP_S + 10)
    return client


def test_a_failed_request_without_its_stream_s_end_ends_its_stream_with_an_error_event(gateway, stages):
    client = _ended_unclosed(gateway, stages, "error")
    assert client.events and client.events[-1] == "[DONE]", f"no end after {client.waited_s:.1f} s"
    error = client.events[-2]["error"]
    assert error["type"] == "server_error" and error["code"] == "generation_failed"


def test_a_finished_request_without_its_stream_s_end_ends_its_stream_with_its_finish(gateway, stages):
    client = _ended_unclosed(gateway, stages, "length", tokens=2)
    assert client.events and client.events[-1] == "[DONE]", f"no end after {client.waited_s:.1f} s"
    chunks = client.events[:-1]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "t0t1"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_a_cancelled_request_without_its_stream_s_end_ends_its_stream_as_cancelled(gateway, stages):
    client = _ended_unclosed(gateway, stages, "cancelled", tokens=1)
    assert client.events and client.events[-1] == "[DONE]", f"no end after {client.waited_s:.1f} s"
    assert client.events[-2]["error"]["code"] == "cancelled"


def test_a_failed_request_without_its_stream_s_end_answers_its_body_with_a_500(gateway, stages):
    client = _ended_unclosed(gateway, stages, "error", stream=False)
    assert client.status == 500, f"no answer after {client.waited_s:.1f} s"
    assert client.body["error"]["code"] == "generation_failed"


def test_the_hub_ends_only_a_quiet_stream_whose_request_ended_without_its_end(redis_url):
    """Three requests whose streams hold two tokens: one ended with its stream's end (its reader gets
    that end, with its usage, and no second), one ended without it (its reader gets an end at the
    stream's next index, the reason ``done`` names), one still running (its reader waits on)."""
    usage = {"prompt_tokens": 3, "completion_tokens": 2}

    async def scenario() -> dict[str, list[Token | None]]:
        commands = aioredis.Redis.from_url(redis_url)
        for rid in ("closed", "unclosed", "running"):
            for i in range(2):
                await commands.xadd(key("tokens", rid), encode(Token(rid, i, 5, str(i))), id=f"{i + 1}-0")
        await commands.xadd(key("tokens", "closed"), encode(Token("closed", 2, -1, "", "stop", usage)), id="3-0")
        await commands.mset({key("done", "closed"): "stop", key("done", "unclosed"): "length"})
        hub, seen = StreamHub(redis_url, commands, block_ms=100), {}
        async with (
            hub.subscribe("closed") as closed,
            hub.subscribe("unclosed") as unclosed,
            hub.subscribe("running") as running,
        ):
            for sub, entries in ((closed, 4), (unclosed, 4), (running, 3)):  # (the last: None, a wait past the end)
                seen[sub.request_id] = [await sub.next(2) for _ in range(entries)]
        await hub.close()
        await commands.aclose()
        return seen

    seen = asyncio.run(scenario())
    assert seen["closed"] == [
        Token("closed", 0, 5, "0"),
        Token("closed", 1, 5, "1"),
        Token("closed", 2, -1, "", "stop", usage),
        None,
    ]
    assert seen["unclosed"][:2] == [Token("unclosed", 0, 5, "0"), Token("unclosed", 1, 5, "1")]
    assert seen["unclosed"][2:] == [Token("unclosed", 2, -1, "", "length"), None]
    assert seen["running"][2] is None


def test_a_finished_body_without_its_stream_s_end_counts_its_prompt_and_tokens(gateway, stages):
    """The end the gateway builds from ``done`` carries no usage: the body counts the request's prompt
    (3 tokens) and the tokens streamed (was: 0 prompt tokens)."""
    client = _ended_unclosed(gateway, stages, "length", tokens=2, stream=False)
    assert client.status == 200, f"no answer after {client.waited_s:.1f} s"
    assert client.body["choices"][0]["text"] == "t0t1" and client.body["choices"][0]["finish_reason"] == "length"
    assert client.body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def test_a_request_no_worker_took_without_its_stream_s_end_ends_its_stream_with_no_worker(gateway, stages):
    """The end the gateway builds carries the code the stage's end had (was: a generic failure)."""
    client = _ended_unclosed(gateway, stages, "error", tokens=1, code="no_worker")
    assert client.events and client.events[-1] == "[DONE]", f"no end after {client.waited_s:.1f} s"
    error = client.events[-2]["error"]
    assert (error["type"], error["code"], error["message"]) == ("service_unavailable", "no_worker", NO_WORKER)


def test_a_request_no_worker_took_without_its_stream_s_end_answers_its_body_with_a_503(gateway, stages):
    client = _ended_unclosed(gateway, stages, "error", code="no_worker", stream=False)
    assert client.status == 503, f"{client.status} after {client.waited_s:.1f} s: {client.body}"
    assert client.body["error"]["code"] == "no_worker" and client.body["error"]["message"] == NO_WORKER


def test_a_finished_body_without_its_stream_s_end_has_the_usage_its_stage_gave(gateway, stages):
    """A finish with usage (a time limit's "length", thinking mode's reasoning tokens) keeps it."""
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "completion_tokens_details": {"reasoning_tokens": 1}}
    client = _ended_unclosed(gateway, stages, "length", tokens=2, stream=False, usage=usage)
    assert client.status == 200, f"no answer after {client.waited_s:.1f} s"
    assert client.body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 1}
