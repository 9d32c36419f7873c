"""A stream read while Redis refuses writes (at its memory limit, no eviction: every write answers
``OOM command not allowed``, reads answer). A read's first commands were writes (its reader mark,
the hub's wake-up): refused, the read ended at once with ``queue_unavailable``, even one of a
request that had finished (the soak's resumes during a refusal). Now the wake-up refused leaves the
subscription to the hub's next blocked read, and the mark is tried again while the stream is read;
so for a request answered in one body. Real processes: Redis, a gateway, a prefill and a decode
worker (and a gateway in-process, to refuse writes right after its admission)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import redis
from fastapi.testclient import TestClient

from dayzero.serving.keys import key
from dayzero.serving.watching import Watching
from dayzero.settings import Settings
from services.gateway.app import make_app

from .conftest import MODEL, resumed_events, sse_events, start_stack, wait_until
from .test_decode_appends import writes_refused

SHORT = {"model": MODEL, "prompt": [0, 5, 6], "max_tokens": 8, "ignore_eos": True, "stream": True}
LONG = {**SHORT, "max_tokens": 400}


@pytest.fixture(scope="module")
def stack(text_dir, tmp_path_factory):
    stack = start_stack(text_dir, tmp_path_factory.mktemp("logs"), {"vision": 0, "prefill": 1, "decode": 1})
    yield stack
    stack.stop()


def _read(url: str, body: dict, events: int | None = None) -> tuple[str, str, list[str]]:
    """Stream ``body``, leaving after ``events`` token events (None: to [DONE]). -> its id, its resume
    token, the event ids read."""
    seen = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        rid, token = response.headers["x-request-id"], response.headers["x-resume-token"]
        for event_id, data in sse_events(response):
            if data == "[DONE]" or len(seen) == events:
                break
            assert "error" not in data, data
            seen.append(event_id)
    return rid, token, seen


def _to_its_end(rest: list[tuple[str | None, dict]], seen: list[str], max_tokens: int) -> None:
    assert "error" not in rest[-1][1], rest[-1]  # (was: queue_unavailable at once)
    assert rest[-1][1]["choices"][0]["finish_reason"] == "length", rest[-1]
    numbers = [int(i.split("-")[0]) for i in seen + [e for e, _ in rest]]
    assert numbers == sorted(set(numbers)) and numbers[-1] == max_tokens  # in order, once, to its end


def test_a_finished_stream_resumed_while_redis_refuses_writes_gets_its_rest_and_done(stack):
    r = redis.Redis.from_url(stack.redis_url)
    rid, token, seen = _read(stack.url, SHORT)
    assert seen[-1] == f"{SHORT['max_tokens']}-0", seen
    assert wait_until(lambda: r.get(key("done", rid)) == b"length", 10)
    # after its first event; or from its start, when the 8 tokens were read as one event (a slow read)
    kept = seen[:1] if len(seen) > 1 else []
    with writes_refused(r):
        with pytest.raises(redis.ResponseError, match="maxmemory"):
            r.set(key("probe", rid), 1)
        rest = resumed_events(stack.url, rid, token, kept[0] if kept else "0-0")  # (resumed_events: to [DONE])
    _to_its_end(rest, kept, SHORT["max_tokens"])


class Resumed(threading.Thread):
    """A client reading a stream again by its id after ``last`` to [DONE]."""

    def __init__(self, url: str, rid: str, token: str, last: str) -> None:
        super().__init__(daemon=True)
        self.args, self.rest, self.failed = (url, rid, token, last), None, None

    def run(self) -> None:
        try:
            self.rest = resumed_events(*self.args)
        except Exception as exc:  # noqa: BLE001 (the test's assertion shows it)
            self.failed = exc


def test_a_running_stream_resumed_while_redis_refuses_writes_reads_to_its_end(stack):
    """Its reader's mark, refused, is made once Redis takes writes again: nothing cancels the request
    under its reader (its leave, after its end, unwatches it)."""
    r = redis.Redis.from_url(stack.redis_url)
    rid, token, seen = _read(stack.url, LONG, events=3)
    assert wait_until(lambda: not r.exists(key("watchers", rid)), 10)  # the first read left: its grace runs
    resumed, log = Resumed(stack.url, rid, token, seen[-1]), stack.log_dir / "gateway.log"
    with writes_refused(r):
        resumed.start()  # the resume begins while every write is refused (was: it ended, queue_unavailable)
        assert wait_until(lambda: f"request {rid}: its watch failed" in log.read_text() or not resumed.is_alive(), 30)
        time.sleep(0.5)  # it reads on through the refusal
    resumed.join(120)
    assert resumed.failed is None, resumed.failed
    _to_its_end(resumed.rest, seen, LONG["max_tokens"])
    assert wait_until(lambda: r.get(key("done", rid)) == b"length", 10) and r.get(key("cancel", rid)) is None
    assert wait_until(lambda: not r.exists(key("watchers", rid)), 10)  # its leave unwatched it


def test_a_request_answered_in_one_body_waits_through_a_refusal_that_begins_after_its_admission(
    stack, text_dir, monkeypatch
):
    """Writes refused from the moment Redis took the request (under load the test's refusal came
    between the admission and the body's reader mark, 6 of 20 rounds at load 10): the mark, refused,
    ended the request 503 ``queue_unavailable`` although it was queued and then served. Now the
    ADMIT script marks the read with the admission itself, and the body comes once Redis takes
    writes."""
    r, real_admit = redis.Redis.from_url(stack.redis_url), Watching.admit

    async def admitted_then_refused(self, *args) -> bool:
        admitted = await real_admit(self, *args)
        await self.r.config_set("maxmemory", 1)  # every write refused from here: the reader mark first
        threading.Timer(1.0, r.config_set, ("maxmemory", 0)).start()
        return admitted

    monkeypatch.setattr(Watching, "admit", admitted_then_refused)
    settings = Settings(checkpoint=text_dir, redis_url=stack.redis_url, lease_s=1.0, keepalive_s=1.0)
    try:
        with TestClient(make_app(settings)) as gateway:
            answer = gateway.post("/v1/completions", json={**SHORT, "stream": False})
    finally:
        assert wait_until(lambda: r.config_get("maxmemory")["maxmemory"] == "0", 5)
    assert answer.status_code == 200, answer.text  # (was: 503 queue_unavailable)
    assert answer.json()["choices"][0]["finish_reason"] == "length"
