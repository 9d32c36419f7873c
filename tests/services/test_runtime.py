"""A worker's runtime: the warm-up before it serves runs the model's paths and leaves no state."""

from __future__ import annotations

import hashlib

import numba
import pytest

from dayzero.kv import handoff
from dayzero.serving.queue_scripts import ADMIT
from dayzero.serving.runtime import WARM_UP, Runtime
from dayzero.serving.scripts import HEARTBEAT, TAKE
from dayzero.settings import Settings
from dayzero.shm import SHM_DIR


@pytest.mark.parametrize("decode", [False, True])
def test_the_warm_up_runs_a_prefill_and_a_decode_step_and_frees_its_blocks(demo_dir, redis_url, decode):
    runtime = Runtime.load(Settings(checkpoint=demo_dir, redis_url=redis_url), "warm@test", "decode", False)
    ran, prefill, step = [], runtime.ranks.prefill, runtime.ranks.decode

    def counted(name, call):
        def run(*args):
            ran.append((name, runtime.pools.length(WARM_UP) if name == "decode" else len(args[0][0].tokens)))
            return call(*args)

        return run

    runtime.ranks.prefill, runtime.ranks.decode = counted("prefill", prefill), counted("decode", step)
    runtime.warm_up(decode)
    rates = runtime.model.cfg.compress_rates.values()
    assert ran[0] == ("prefill", max(rates) + 2)  # every compressor folds an entry: the indexer runs
    assert ran[1:] == ([("decode", max(rates) + 2)] if decode else [])
    assert runtime.pools.sequences == {} and all(used == 0 for used, _ in runtime.pools.usage().values())


@pytest.mark.parametrize(("stage", "transport"), [("decode", "shm"), ("prefill", "shm"), ("prefill", "redis")])
def test_the_warm_up_compiles_the_host_copy_a_handoff_calls(demo_dir, redis_url, monkeypatch, stage, transport):
    """Decode's first import (prefill's first pack for Redis, or its first copy of a state to an
    identical prompt, over either transport) waited 1-2 s for numba's cache, ~10 s for a compile:
    the warm-up calls the copy with the types a handoff calls it with (numba compiles once per
    types: a writable plan would be another compile)."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff=transport)
    runtime = Runtime.load(settings, "copy@test", stage, False)
    calls = []
    monkeypatch.setattr(handoff, "copy_host_blocks", lambda *args: calls.append([numba.typeof(a) for a in args]))
    runtime.warm_up(decode=stage == "decode")
    pools = runtime.pools
    pools.reserve("s", 5)
    handoff.import_state(pools, pools, handoff.export_state(pools, "s"), "copy")  # a handoff's call, a copy's
    assert calls[:-1] == [calls[-1]]


def test_pools_too_small_for_the_warm_up_skip_it(demo_dir, redis_url, caplog):
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, kv_budget_mb=1, max_batch=1)
    runtime = Runtime.load(settings, "small@test", "prefill", False)
    runtime.pools.reserve("someone", runtime.pools.capacity_tokens())  # every block taken
    runtime.warm_up(decode=False)
    assert "no warm-up" in caplog.text and set(runtime.pools.sequences) == {"someone"}
    assert "DAYZERO_KV_BUDGET_MB=1 holds " in caplog.text and "tokens of one sequence, under the context" in caplog.text


def test_the_warm_up_loads_the_lifecycles_scripts_into_redis(demo_dir, redis_url):
    runtime = Runtime.load(Settings(checkpoint=demo_dir, redis_url=redis_url), "scripts@test", "prefill", False)
    runtime.store.r.script_flush()
    shas = [hashlib.sha1(script.encode()).hexdigest() for script in (ADMIT, TAKE, HEARTBEAT)]
    runtime.warm_up(decode=False)
    assert runtime.store.r.script_exists(*shas) == [True, True, True]  # no request finds one missing


def test_prefill_s_activation_estimate_is_a_whole_step_s(demo_dir, redis_url):
    """A prefill step packs up to DAYZERO_MAX_PREFILL_TOKENS of several prompts' chunks: its
    activations and hyper-connection state are estimated for that many rows, not one chunk's."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, prefill_chunk_size=64, max_prefill_tokens=256)
    runtime = Runtime.load(settings, "estimate@test", "prefill", False)
    cfg, elem = runtime.model.cfg, runtime.model.head.weight.element_size()
    regions = runtime.memory_regions(batch=1)
    assert regions["activations"] == 256 * cfg.hidden_size * elem * 8
    assert regions["hyper_connection_state"] == 256 * cfg.hc_mult * cfg.hidden_size * 4 * 2


def test_a_runtime_closed_twice_unlinks_its_pool_segment_once(demo_dir, redis_url):
    """SIGTERM: Celery's shutdown closes the runtime, and the stop's watchdog closes it again when the
    process still runs after the grace (a tensor-parallel group's ranks ending): the second unlink
    raised FileNotFoundError, the watchdog died before its exit and the worker ran on until
    ``dayzero up`` SIGKILLed it."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, kv_budget_mb=4)
    runtime = Runtime.load(settings, "closed@test", "prefill", True)
    name = runtime.segment.name
    runtime.close()
    runtime.close()
    assert not (SHM_DIR / name).exists()
