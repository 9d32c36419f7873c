"""``/ready`` on a real gateway and Redis, the workers' side played by real worker runtimes that
announce themselves as a worker does (started by hand, they may disagree with each other), and
stamp their liveness as its Pulse does."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import pytest
import redis

from dayzero.serving.keys import key
from dayzero.serving.liveness import FRESH_S, Pulse, connect, process_id, serving
from dayzero.serving.no_worker_count import unserved_for
from dayzero.serving.registry import Registry
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from .conftest import MODEL, SETTINGS_ENV, start_gateway_alone, wait_until
from .test_liveness_clock import SKEWED_CLOCK, announced, skewed_worker


@pytest.fixture(scope="module")
def gateway(demo_dir, tmp_path_factory):
    stack = start_gateway_alone(demo_dir, tmp_path_factory.mktemp("logs"))  # DAYZERO_MAX_CONTEXT 4096
    yield stack
    stack.stop()


@pytest.fixture
def registry(gateway):
    store = Registry(redis.Redis.from_url(gateway.redis_url))
    yield store
    stages = ("vision", "prefill", "decode")
    store.r.delete(*(key(family, stage) for stage in stages for family in ("workers", "alive", "ready")))


def _runtime(demo_dir, gateway, name: str, stage: str, **settings) -> Runtime:
    base = Settings(checkpoint=demo_dir, redis_url=gateway.redis_url, handoff="redis", kv_budget_mb=8, max_batch=2)
    return Runtime.load(base.model_copy(update=settings), name, stage, False)


def _stamped(gateway, stage: str, process: str) -> None:
    """A ready worker process's liveness stamp, now (as its Pulse writes it)."""
    pulse = Pulse(connect(gateway.redis_url), stage)
    pulse.process = process
    pulse.ready()


def _ready(gateway, workers: list[Runtime], registry: Registry) -> tuple[int, dict]:
    """``/ready`` once ``workers`` announce themselves and stamp their liveness."""
    registry.alive("vision", "vision0@test:0a0b0c")  # the demo checkpoint reads images
    _stamped(gateway, "vision", "test:0a0b0c")
    for runtime in workers:
        runtime.announce(1)  # a heartbeat with the worker's metrics snapshot
        _stamped(gateway, runtime.stats.stage, runtime.name)
    answer = httpx.get(f"{gateway.url}/ready", timeout=5)
    return answer.status_code, answer.json()


# a decode worker's liveness stamps in a process of its own (a thread, every second, a long step too)
PULSE = """
import sys, time
from dayzero.serving.liveness import Pulse, connect
Pulse(connect(sys.argv[1]), "decode").start().ready()
time.sleep(300)
"""


def test_ready_follows_the_workers_liveness_stamps_not_their_loops_heartbeats(demo_dir, gateway, registry):
    """/ready counted a worker by its loop's heartbeats, for 3 leases + 2 s after the last one (a
    step may run that long between two): a SIGKILLed decode worker left /ready at 200 for ~11 s at
    the default lease, with nothing to serve. Now its liveness stamps say: one killed is out once
    its stamp is older than FRESH_S, its loop's heartbeat however recent; one busy in a step longer
    than the heartbeats' window (its loop silent, its stamps going on) stays ready."""
    prefill = _runtime(demo_dir, gateway, "prefill0@test", "prefill")
    decode = _runtime(demo_dir, gateway, "decode0@test", "decode")
    worker = subprocess.Popen([sys.executable, "-c", PULSE, gateway.redis_url])
    try:
        assert wait_until(lambda: serving(registry.r, "decode"), 60)
        decode.announce(1)  # its loop's heartbeat (its stamps: the process's)
        status, body = _ready(gateway, [prefill], registry)
        assert status == 200 and body["workers"]["decode"] == 1, body
        time.sleep(3 * float(SETTINGS_ENV["DAYZERO_LEASE_S"]) + 3)  # every step past the heartbeats' window
        _stamped(gateway, "prefill", prefill.name)  # (their stamps go on)
        _stamped(gateway, "vision", "test:0a0b0c")
        answer = httpx.get(f"{gateway.url}/ready", timeout=5)
        assert answer.status_code == 200, answer.json()

        worker.send_signal(signal.SIGKILL)
        worker.wait()
        assert wait_until(lambda: process_id(worker.pid) not in serving(registry.r, "decode"), FRESH_S + 2)
        decode.announce(1)  # its loop's heartbeat: now
        status, body = _ready(gateway, [prefill], registry)
        assert status == 503 and body["reason"] == "no live worker for decode" and body["workers"]["decode"] == 0
    finally:
        worker.kill()
        worker.wait()


@pytest.mark.parametrize("skew", [-4 * FRESH_S, 4 * FRESH_S])
def test_a_worker_on_a_host_whose_clock_is_off_is_live_while_it_stamps_and_out_once_it_stops(
    demo_dir, gateway, registry, skew
):
    """Workers stamped their liveness by their own clocks, the gateway read them by its: a worker on
    a host 3 s or more behind the gateway's was never live (/ready 503 "no live worker", its stage's
    no-worker count running: its requests ended), one ahead stayed live that long after a SIGKILL.
    Now both sides use Redis's clock: the hosts' clocks play no part."""
    prefill = _runtime(demo_dir, gateway, "prefill0@test", "prefill")
    worker = subprocess.Popen([sys.executable, "-c", SKEWED_CLOCK.format(skew=skew) + PULSE, gateway.redis_url])
    process = process_id(worker.pid)
    try:
        assert wait_until(lambda: registry.r.hexists(key("ready", "decode"), process), 60)
        status, body = _ready(gateway, [prefill], registry)
        assert status == 200 and body["workers"]["decode"] == 1, body
        assert unserved_for(registry.r, "decode") == 0.0

        worker.send_signal(signal.SIGKILL)
        worker.wait()
        assert wait_until(lambda: process not in serving(registry.r, "decode"), FRESH_S + 2)
        status, body = _ready(gateway, [prefill], registry)
        assert status == 503 and body["reason"] == "no live worker for decode", body
    finally:
        worker.kill()
        worker.wait()
        registry.r.delete(key("unserved", "decode"), key("restart", "decode"))


def test_a_worker_on_a_host_whose_clock_is_behind_has_its_settings_compared(demo_dir, gateway, registry, tmp_path):
    """/ready compared the settings of the workers whose heartbeats were within 3 leases + 2 s of the
    gateway's clock: a decode worker on a host further behind was left out, and /ready said ready
    with prefill and decode sharing no KV layout (every request failing at decode's admission). Now
    the heartbeats are on Redis's clock: the real decode worker, its process's clock 20 s behind,
    is compared."""
    prefill = _runtime(demo_dir, gateway, "prefill0@test", "prefill", block_size=16)
    env = {**SETTINGS_ENV, "DAYZERO_CHECKPOINT": str(demo_dir), "DAYZERO_REDIS_URL": gateway.redis_url}
    worker = skewed_worker("decode", "decode0", -20.0, tmp_path / "decode0.log", {**env, "DAYZERO_BLOCK_SIZE": "32"})
    try:
        assert wait_until(lambda: announced(registry.r, "decode", "decode0") and serving(registry.r, "decode"), 120)
        status, body = _ready(gateway, [prefill], registry)
        assert status == 503 and "share no KV layout" in body["reason"], body
    finally:
        worker.terminate()
        worker.wait(60)


def test_ready_shows_how_far_starting_workers_have_loaded(gateway, registry):
    registry.loading("prefill0@host:1a2b3c", "prefill", 45)
    body = httpx.get(f"{gateway.url}/ready", timeout=5).json()
    assert body["loading"] == {"prefill0@host:1a2b3c": 45} and "prefill0@host:1a2b3c 45%" in body["reason"]
    registry.loading("prefill0@host:1a2b3c", "prefill", None)  # loaded
    assert "loading" not in httpx.get(f"{gateway.url}/ready", timeout=5).json()


def test_ready_leaves_out_the_loading_progress_of_a_start_that_died(gateway, registry):
    """A worker that dies while it loads (a crash loop under ``dayzero up``) left its progress for
    2 minutes: ``up``'s waiting lines listed each dead start beside the new one. A start counts while
    its process stamps its liveness (as a loading worker does, not ready yet)."""
    loading = Pulse(connect(gateway.redis_url), "decode")
    loading.process = "host:1001"
    loading._stamp()  # alive, loading (what its Pulse thread writes every second)
    registry.loading("decode0@host:0a0a0a", "decode", 30, process="host:1001")
    registry.loading("decode0@host:dead00", "decode", 0, process="host:1000")  # never stamped: gone
    try:
        body = httpx.get(f"{gateway.url}/ready", timeout=5).json()
        assert body["loading"] == {"decode0@host:0a0a0a": 30}, body
    finally:
        registry.loading("decode0@host:0a0a0a", "decode", None)
        registry.loading("decode0@host:dead00", "decode", None)


def test_ready_leaves_out_a_dead_start_of_a_restarted_container_under_the_same_process_name(gateway, registry):
    """A container restarted keeps its hostname and its worker's pid 1: the new start stamps under
    the dead one's process name, and /ready listed the dead start's progress beside the new one's
    for up to 2 minutes, and after the new one had loaded too (while it warmed up, the dead start,
    the only entry left of its process, was taken for the latest)."""
    restarted = Pulse(connect(gateway.redis_url), "decode")
    restarted.process = "container-7:1"
    restarted._stamp()  # alive, loading
    registry.loading("decode0@container-7:dead01", "decode", 60, process="container-7:1", started=1000.0)
    registry.loading("decode0@container-7:0a0a01", "decode", 10, process="container-7:1", started=1090.0)
    try:
        body = httpx.get(f"{gateway.url}/ready", timeout=5).json()
        assert body["loading"] == {"decode0@container-7:0a0a01": 10}, body
        registry.loading("decode0@container-7:0a0a01", "decode", None, process="container-7:1")  # loaded,
        restarted._stamp()  # warming up (alive, not ready)
        assert "loading" not in httpx.get(f"{gateway.url}/ready", timeout=5).json()
        restarted.ready()  # warmed up and serving
        assert "loading" not in httpx.get(f"{gateway.url}/ready", timeout=5).json()
    finally:
        restarted.stop()
        registry.loading("decode0@container-7:dead01", "decode", None)


def test_prefill_and_decode_of_different_block_sizes_are_not_ready_naming_the_settings(demo_dir, gateway, registry):
    """Started by hand with different DAYZERO_BLOCK_SIZE: /ready said ready, and every request failed
    at decode's admission."""
    prefill = _runtime(demo_dir, gateway, "prefill0@test", "prefill", block_size=16)
    decode = _runtime(demo_dir, gateway, "decode0@test", "decode", block_size=32)
    status, body = _ready(gateway, [prefill, decode], registry)
    assert status == 503 and body["ready"] is False, body
    assert "share no KV layout" in body["reason"] and "DAYZERO_BLOCK_SIZE" in body["reason"]
    assert body["workers"] == {"vision": 1, "prefill": 1, "decode": 1}

    matching = _runtime(demo_dir, gateway, "decode1@test", "decode", block_size=16)  # one pair can serve
    status, body = _ready(gateway, [prefill, decode, matching], registry)
    assert status == 200 and body["ready"] is True, body
    (warning,) = body["warnings"]
    assert warning.startswith(f"decode worker {decode.name}: its KV layout matches no prefill worker's")


def test_a_decode_worker_of_a_shorter_context_than_the_gateway_admits_is_a_warning(demo_dir, gateway, registry):
    """DAYZERO_MAX_CONTEXT 4096 at the gateway, 1024 at decode: completions past 1024 tokens ended
    early with nothing said anywhere."""
    prefill = _runtime(demo_dir, gateway, "prefill0@test", "prefill")
    decode = _runtime(demo_dir, gateway, "decode0@test", "decode", max_context=1024)
    status, body = _ready(gateway, [prefill, decode], registry)
    assert status == 200, body
    (warning,) = body["warnings"]
    assert f"decode worker {decode.name} serves 1024 tokens of context, the gateway admits 4096" in warning
    assert "DAYZERO_MAX_CONTEXT" in warning


def test_decode_workers_drafting_otherwise_than_the_gateway_is_a_warning(demo_dir, gateway, registry):
    """The gateway's system_fingerprint hashes its own DAYZERO_SPECULATIVE_TOKENS (0 here), decode
    draws by its own (2): a seed drew otherwise under the same fingerprint, and nothing said so."""
    prefill = _runtime(demo_dir, gateway, "prefill0@test", "prefill", speculative_tokens=2)
    decode = _runtime(demo_dir, gateway, "decode0@test", "decode", speculative_tokens=2)
    status, body = _ready(gateway, [prefill, decode], registry)
    assert status == 200, body
    (warning,) = body["warnings"]
    said = f"decode worker {decode.name} drafts 2 tokens a step, the gateway's DAYZERO_SPECULATIVE_TOKENS is 0"
    assert said in warning, warning


def test_a_worker_whose_pools_hold_less_than_the_context_is_a_warning(demo_dir, gateway, registry):
    """Started by hand with a budget too small for the context: only its own log said so."""
    prefill = _runtime(demo_dir, gateway, "prefill0@test", "prefill", kv_budget_mb=1, max_batch=40)
    decode = _runtime(demo_dir, gateway, "decode0@test", "decode")
    status, body = _ready(gateway, [prefill, decode], registry)
    assert status == 200, body
    (warning,) = [w for w in body["warnings"] if w.startswith(f"prefill worker {prefill.name} serves ")]
    assert prefill.pools.capacity_tokens() < 4096 and "DAYZERO_KV_BUDGET_MB" in warning


def test_a_decode_worker_that_refuses_a_prefill_workers_block_ids_as_bytes_is_a_warning(demo_dir, gateway, registry):
    """A prefill worker of the default DAYZERO_HANDOFF_IDS (bytes) beside a decode worker of a version
    before the setting (its snapshot names no ``ids``): that decode worker refuses those handoffs'
    messages. A prefill worker set to ``lists`` writes what it reads: no warning."""
    prefill = _runtime(demo_dir, gateway, "prefill0@test", "prefill")
    upgraded = _runtime(demo_dir, gateway, "decode0@test", "decode")
    status, body = _ready(gateway, [prefill, upgraded], registry)
    assert status == 200 and "warnings" not in body, body
    older = _runtime(demo_dir, gateway, "decode1@test", "decode")
    del older.stats.serves["ids"]  # (what a worker of a version before the setting announces)
    status, body = _ready(gateway, [prefill, upgraded, older], registry)
    assert status == 200, body
    (warning,) = body["warnings"]
    assert warning.startswith(f"decode worker {older.name} is of a version before DAYZERO_HANDOFF_IDS")
    assert prefill.name in warning and "DAYZERO_HANDOFF_IDS=lists" in warning
    prefill.stats.serves["ids"] = "lists"  # (the setting, as that worker announces it)
    prefill.presence.beat(lambda: prefill.snapshot(1))  # (announce skips a beat within a quarter lease)
    status, body = _ready(gateway, [prefill, upgraded, older], registry)
    assert status == 200 and "warnings" not in body, body


def test_every_get_route_answers_head_as_get(gateway, registry):
    """Uptime monitors and load balancers probe with HEAD: it was 405 on /health and /ready, then on
    /metrics and /v1/models (every route GET serves, listed in the OpenAPI schema, is checked). An
    event stream's HEAD would open the stream: 405 with Allow: GET."""
    paths = httpx.get(f"{gateway.url}/openapi.json", timeout=5).json()["paths"]
    served = [
        path.replace("{model}", MODEL) for path, ops in paths.items() if "get" in ops and "{request_id}" not in path
    ]
    assert {"/health", "/ready", "/metrics", "/v1/models", f"/v1/models/{MODEL}"} <= set(served), served
    for path in [*served, "/v1/models/unknown", "/docs"]:
        got, head = httpx.get(f"{gateway.url}{path}", timeout=5), httpx.head(f"{gateway.url}{path}", timeout=5)
        assert head.status_code == got.status_code != 405, (path, head.status_code, got.status_code)
        assert head.headers["content-type"] == got.headers["content-type"] and head.content == b"", path
    stream = httpx.head(f"{gateway.url}/v1/requests/abc/stream", timeout=5)
    assert stream.status_code == 405 and stream.headers["allow"] == "GET", stream.headers


def test_ready_says_redis_is_unanswered_within_a_probes_wait_while_redis_is_frozen(gateway, registry):
    """A frozen Redis (SIGSTOP: its connections open, nothing answered) is /ready's reason within a
    probe's wait: it was answered after the gateway's 10 s command timeout, a probe (Kubernetes' waits
    1 s, this one 4 s) seeing a hang. Continued, Redis is ready's again."""
    gateway.redis.send_signal(signal.SIGSTOP)
    try:
        answer = httpx.get(f"{gateway.url}/ready", timeout=4)
    finally:
        gateway.redis.send_signal(signal.SIGCONT)
    assert answer.status_code == 503 and answer.json()["reason"].startswith("redis unanswered"), answer.text
    assert wait_until(
        lambda: httpx.get(f"{gateway.url}/ready", timeout=5).json()["reason"] != answer.json()["reason"], 30
    )
