"""A real stack for the pipeline tests: embedded Redis, the gateway and worker processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time

import httpx
import pytest
import redis
from fastapi.testclient import TestClient

from dayzero.demo import write_demo_checkpoint
from dayzero.procs import free_port
from dayzero.settings import Settings
from dayzero.stack import Stack, StartFailed
from dayzero.stack_child import Child
from services.gateway.app import make_app

from ..conftest import shared
from .in_process import engine_completer

MODEL = "dayzero-demo"
USAGE = {"stream_options": {"include_usage": True}}  # a stream ends with its usage chunk
SETTINGS_ENV = {
    "DAYZERO_LEASE_S": "1.0",
    "DAYZERO_DISCONNECT_GRACE_S": "0.3",
    "DAYZERO_KEEPALIVE_S": "1.0",
    "DAYZERO_MAX_BATCH": "16",
    "DAYZERO_KV_BUDGET_MB": "32",
    "DAYZERO_MAX_CONTEXT": "4096",
    "DAYZERO_MAX_TOKENS_LIMIT": "2048",
    "DAYZERO_MAX_REQUEST_BYTES": "65536",
}


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory):
    return write_demo_checkpoint(tmp_path_factory.mktemp("served"), vision=True, fp4=True)


CAPPED_CONTEXT = 4096  # a request let through asks max_tokens of it: refused for the context, never queued


@pytest.fixture(scope="module")
def capped_gateway(demo_dir, redis_url):
    """The gateway in-process on a real Redis, no workers, its context ``CAPPED_CONTEXT``."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, max_context=CAPPED_CONTEXT)
    with TestClient(make_app(settings)) as client:
        yield client


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    """A real Redis of the module's own (for tests that run stages in-process)."""
    from dayzero.procs import scratch_redis

    with scratch_redis(tmp_path_factory.mktemp("redis")) as port:
        yield f"redis://127.0.0.1:{port}/0"


def start_stack(demo_dir, log_dir, counts, extra=None, ranks=None, redis_url=None) -> Stack:
    """``ranks``: tensor-parallel ranks per prefill / decode worker; ``redis_url``: a Redis of the
    caller's (else the stack's own)."""
    env = {**SETTINGS_ENV, "DAYZERO_CHECKPOINT": str(demo_dir), **(extra or {})}
    stack = Stack(counts, free_port(), log_dir, env, ranks=ranks or {}, redis_url=redis_url)
    stack.start()
    try:
        stack.wait_ready(timeout_s=180)
    except Exception:
        stack.stop()
        for log in sorted(log_dir.glob("*.log")):
            print(f"== {log.name}\n{log.read_text()[-3000:]}")
        raise
    return stack


def start_gateway_alone(demo_dir, log_dir, extra=None) -> Stack:
    """A gateway and its Redis, no workers: up once it answers /health (/ready would wait for ever)."""
    env = {**SETTINGS_ENV, "DAYZERO_CHECKPOINT": str(demo_dir), **(extra or {})}
    stack = Stack({"vision": 0, "prefill": 0, "decode": 0}, free_port(), log_dir, env)
    stack.start()
    try:
        stack.until_ready("gateway", 60)  # (it answers /health)
    except StartFailed:
        stack.stop()
        raise
    return stack


@pytest.fixture(scope="module")
def lone_gateway(demo_dir, tmp_path_factory):
    extra = {
        "DAYZERO_MAX_QUEUED": "2",
        "DAYZERO_API_KEYS": "sesame, other",  # a comma-separated list
        "DAYZERO_METRICS_AUTH": "true",
        "DAYZERO_IMAGE_MAX_COUNT": "2",
        "DAYZERO_MAX_REQUEST_BYTES": str(1 << 20),  # room for a chat far over the context
        "DAYZERO_NO_WORKER_TIMEOUT_S": "3600",  # requests wait here for workers that never come
    }
    stack = start_gateway_alone(demo_dir, tmp_path_factory.mktemp("logs"), extra)
    yield stack
    stack.stop()


KEY = {"Authorization": "Bearer sesame"}  # (one of the API keys lone_gateway accepts)

FULL_COUNTS = {"vision": 1, "prefill": 1, "decode": 2}


@pytest.fixture(scope="session")
def stack(request, demo_dir, tmp_path_factory, session_stacks):
    """A stack the modules that only send it requests share (a start and a stop each cost ~20 s);
    a module that kills, stops or reconfigures its parts starts its own (see test_failures)."""
    s = shared(request, start_stack(demo_dir, tmp_path_factory.mktemp("logs"), FULL_COUNTS), session_stacks)
    yield s
    s.stop()  # (stopped already after its last user, unless the session ended sooner)


def chat(content: str, **kw) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "temperature": 0, **kw}


def sse_events(response: httpx.Response):
    """(event id or None, data) pairs of a streamed response."""
    event_id = None
    for line in response.iter_lines():
        if line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:"):
            data = line[5:].strip()
            yield event_id, data if data == "[DONE]" else json.loads(data)
            event_id = None


def resumed_events(url: str, rid: str, token: str, last_event_id: str) -> list[tuple[str | None, dict]]:
    """A stream read again by its id after ``last_event_id`` (as EventSource does: the token in the
    query), to ``[DONE]``: its (event id, data) pairs, ending with its final chunk."""
    rest, target = [], f"{url}/v1/requests/{rid}/stream?resume_token={token}"
    with httpx.stream("GET", target, headers={"Last-Event-ID": last_event_id}, timeout=120) as response:
        assert response.status_code == 200, response.read()
        for event_id, data in sse_events(response):
            if data == "[DONE]":
                break
            rest.append((event_id, data))
    return rest


def stream_text(url: str, body: dict, timeout: float = 120) -> tuple[str, list[str], dict, dict | None]:
    """Text, event ids, the final chunk of one streamed request, and the usage of its usage chunk
    (OpenAI's: after the final chunk, no choices; None when the body did not ask for it)."""
    text, ids, final, usage = [], [], None, None
    asked = bool((body.get("stream_options") or {}).get("include_usage"))
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=timeout) as r:
        assert r.status_code == 200, r.read()
        for event_id, data in sse_events(r):
            if data == "[DONE]":
                break
            assert usage is None, "the usage chunk comes last"
            assert ("usage" in data) == asked, "with include_usage every chunk has usage (null but the last)"
            assert data.get("usage") is None or not data["choices"], "usage rides on a chunk of its own"
            if not data["choices"]:
                assert final is not None and event_id is None
                usage = data["usage"]
                continue
            choice = data["choices"][0]
            text.append(choice.get("text") or choice.get("delta", {}).get("content") or "")
            if event_id:
                ids.append(event_id)
            if choice["finish_reason"]:
                final = data
    return "".join(text), ids, final, usage


def stream_killing_its_worker(
    stack: Stack, body: dict, after: int | None, back: bool = False, sig: int = signal.SIGKILL
) -> tuple[str, list[int], Child | None]:
    """A streamed completion's text and its events' token indices, the worker holding its lease sent
    ``sig`` once ``after`` events came (None: never), and that child. The stack starts it again:
    with ``back``, before the stream is read on (a stage's only worker: the re-run waits for it)."""
    text, indices, killed = [], [], None
    with httpx.stream("POST", f"{stack.url}/v1/completions", json={**body, "stream": True}, timeout=120) as resp:
        rid = resp.headers["x-request-id"]
        for event_id, data in sse_events(resp):
            if data == "[DONE]":
                break
            text.append(data["choices"][0]["text"])
            indices.append(int(event_id.split("-")[0]))
            if len(indices) == after:
                owner = redis.Redis.from_url(stack.redis_url).get(f"dz:lease:{rid}").decode()  # "decode1@host:ab12cd"
                killed = stack.child(owner.split("@")[0])
                os.killpg(killed.proc.pid, sig)
                if back:
                    killed.proc.wait(30)
                    stack.until_ready(killed.name)
    return "".join(text), indices, killed


def pool_usage(stack: Stack) -> dict[str, dict]:
    """Each worker's latest metrics snapshot (its pools' usage among them)."""
    import redis

    from dayzero.serving.registry import Registry

    return Registry(redis.Redis.from_url(stack.redis_url)).snapshots()


def wait_until(predicate, timeout_s: float, step_s: float = 0.05):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step_s)
    return predicate()


def stopped(proc: subprocess.Popen, grace_s: float = 15) -> None:
    """SIGTERM ``proc`` (a test's own child, not a group leader), SIGKILL it after ``grace_s``, reap it."""
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_jobs(loop, jobs, timeout_s: float = 120) -> None:
    """Submit ``jobs`` to a prefill or decode loop before it runs (one batch), run it on a thread
    until every job is settled, then stop it."""
    tickets = [loop.intake.submit(job) for job in jobs]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        assert all(t.done.wait(timeout_s) for t in tickets)
    finally:
        loop.stop.set()
        thread.join(30)  # a thread still inside torch when the interpreter exits aborts it (SIGABRT)


def recording(sent: list, stage: str = "decode"):
    """A stage's message maker for ``stage`` (prefill's for decode, vision's for prefill) that keeps
    each job it is given in ``sent``; the stage pushes the message (a real task message) onto the
    stage's list with the request's marks."""
    from dayzero.serving.queue import composer, make_celery
    from dayzero.settings import Settings

    compose = composer(make_celery(Settings()), stage)

    def message(job) -> str:
        sent.append(job)
        return compose(job)

    return message


@pytest.fixture(scope="module")
def reference(demo_dir):
    """The same checkpoint run in-process by dayzero's engine (no queue, no handoff)."""
    return engine_completer(demo_dir, "cpu")


def prompt_ids(i: int) -> list[int]:
    """The i-th of a family of token prompts of growing length."""
    return [0, *[(7 * i + 3 * k) % 500 + 2 for k in range(5 + 3 * i)]]


def data_url(width: int, height: int, seed: int) -> str:
    import base64

    from ..vision.conftest import encoded

    return "data:image/png;base64," + base64.b64encode(encoded(width, height, seed=seed)).decode()


@pytest.fixture(scope="session")
def bare_stack(request, demo_dir, tmp_path_factory, session_stacks):
    """The demo checkpoint (a vision tower among its parts) downloaded without its tokenizer (shared
    by the modules that send it requests, as ``stack``)."""
    bare = shutil.copytree(demo_dir, tmp_path_factory.mktemp("bare") / "ckpt")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bare / name).unlink()
    s = shared(
        request,
        start_stack(bare, tmp_path_factory.mktemp("logs"), {"vision": 1, "prefill": 1, "decode": 1}),
        session_stacks,
    )
    yield s
    s.stop()


@pytest.fixture(scope="session")
def text_dir(tmp_path_factory):
    """A checkpoint without a vision tower: stacks of gateway + prefill + decode only."""
    return write_demo_checkpoint(tmp_path_factory.mktemp("text"), fp4=True)
