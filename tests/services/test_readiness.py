"""``/ready`` on a real gateway and Redis, the workers' side played by real worker runtimes that
announce themselves as a worker does (started by hand, they may disagree with each other)."""

from __future__ import annotations

import httpx
import pytest
import redis

from dayzero.serving.keys import key
from dayzero.serving.registry import Registry
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from .conftest import start_gateway_alone


@pytest.fixture(scope="module")
def gateway(demo_dir, tmp_path_factory):
    stack = start_gateway_alone(demo_dir, tmp_path_factory.mktemp("logs"))  # DAYZERO_MAX_CONTEXT 4096
    yield stack
    stack.stop()


@pytest.fixture
def registry(gateway):
    store = Registry(redis.Redis.from_url(gateway.redis_url))
    yield store
    store.r.delete(*(key("workers", stage) for stage in ("vision", "prefill", "decode")))


def _runtime(demo_dir, gateway, name: str, stage: str, **settings) -> Runtime:
    base = Settings(checkpoint=demo_dir, redis_url=gateway.redis_url, handoff="redis", kv_budget_mb=8, max_batch=2)
    return Runtime.load(base.model_copy(update=settings), name, stage, False)


def _ready(gateway, workers: list[Runtime], registry: Registry) -> tuple[int, dict]:
    registry.alive("vision", "vision0@test:0a0b0c")  # the demo checkpoint reads images
    for runtime in workers:
        runtime.announce(1)  # a heartbeat with the worker's metrics snapshot
    answer = httpx.get(f"{gateway.url}/ready", timeout=5)
    return answer.status_code, answer.json()


def test_ready_shows_how_far_starting_workers_have_loaded(gateway, registry):
    registry.loading("prefill0@host:1a2b3c", "prefill", 45)
    body = httpx.get(f"{gateway.url}/ready", timeout=5).json()
    assert body["loading"] == {"prefill0@host:1a2b3c": 45} and "prefill0@host:1a2b3c 45%" in body["reason"]
    registry.loading("prefill0@host:1a2b3c", "prefill", None)  # loaded
    assert "loading" not in httpx.get(f"{gateway.url}/ready", timeout=5).json()


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


def test_a_worker_whose_pools_hold_less_than_the_context_is_a_warning(demo_dir, gateway, registry):
    """Started by hand with a budget too small for the context: only its own log said so."""
    prefill = _runtime(demo_dir, gateway, "prefill0@test", "prefill", kv_budget_mb=1, max_batch=40)
    decode = _runtime(demo_dir, gateway, "decode0@test", "decode")
    status, body = _ready(gateway, [prefill, decode], registry)
    assert status == 200, body
    (warning,) = [w for w in body["warnings"] if w.startswith(f"prefill worker {prefill.name} serves ")]
    assert prefill.pools.capacity_tokens() < 4096 and "DAYZERO_KV_BUDGET_MB" in warning
