"""Tensor-parallel worker groups end to end: real Redis, gateway and worker processes, each
prefill / decode worker a group of real gloo ranks. Completions equal the one-rank engine run
in-process (greedy, fp32; the ranks' sums differ by rounding, far below a logit gap that would
change a token on these prompts). Float checkpoints: the release's 128x128 FP8 blocks do not
split at the demo's sizes (FP8 / FP4 splitting is tested in tests/parallel).
"""

from __future__ import annotations

import signal
import time
from contextlib import contextmanager

import httpx
import psutil
import pytest

from dayzero.demo import write_demo_checkpoint
from dayzero.procs import free_port

from .conftest import (
    MODEL,
    pool_usage,
    prompt_ids,
    sse_events,
    start_stack,
    wait_until,
)
from .in_process import engine_completer
from .launch import up_process, wait_ready
from .served_equals import assert_concurrent_streams_equal_reference, assert_image_request_equals_in_process_run


@pytest.fixture(scope="module")
def vision_dir(tmp_path_factory):
    return write_demo_checkpoint(tmp_path_factory.mktemp("tp-vision"), vision=True)


@pytest.fixture(scope="module")
def text_checkpoint(tmp_path_factory):
    """The two fault tests' float text checkpoint (read only: one written, one reference loaded)."""
    return write_demo_checkpoint(tmp_path_factory.mktemp("tp-text"))


def test_two_rank_prefill_and_decode_groups_serve_what_one_rank_computes(vision_dir, tmp_path):
    reference = engine_completer(vision_dir, "cpu")
    counts, ranks = {"vision": 1, "prefill": 1, "decode": 1}, {"prefill": 2, "decode": 2}
    stack = start_stack(vision_dir, tmp_path, counts, ranks=ranks)
    try:
        assert_concurrent_streams_equal_reference(stack.url, reference, streams=8, base_tokens=10)
        assert_image_request_equals_in_process_run(stack.url, vision_dir)
        groups = {s["stage"]: s["gauges"].get("tensor_parallel") for s in pool_usage(stack).values()}
        assert groups == {"vision": None, "prefill": 2, "decode": 2}
    finally:
        stack.stop()


def _rank(worker: psutil.Process, index: int) -> psutil.Process:
    """Rank ``index`` of the group whose rank 0 is ``worker`` (its multiprocessing children)."""
    ranks = [p for p in worker.children() if "spawn_main" in " ".join(p.cmdline())]
    assert len(ranks) == 1, [p.cmdline() for p in worker.children()]
    return ranks[index - 1]


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _worker(up: psutil.Process, name: str) -> psutil.Process | None:
    return next((p for p in up.children() if p.cmdline()[-2:] == ["--name", name]), None)


@pytest.mark.slow
def test_a_killed_rank_takes_its_group_down_and_the_stream_completes(text_checkpoint, tmp_path):
    """``dayzero up --decode-tp 2`` (prefill on one rank: a 1 -> 2 handoff); SIGKILL decode's
    rank 1 mid-stream: rank 0 exits within seconds, up restarts the group, the request's lease
    lapses and it is re-run; the client's stream ends with the same greedy tokens."""
    with _decode_in_two_ranks(text_checkpoint, tmp_path) as (url, supervisor, reference, _):
        decode0 = _worker(supervisor, "decode0")
        victim = _rank(decode0, 1)

        def kill_rank_1() -> None:
            victim.kill()
            killed = time.monotonic()
            assert wait_until(lambda: not _alive(decode0), 15.0), "rank 0 outlived its killed rank 1 by 15 s"
            assert time.monotonic() - killed < 15.0

        ids = prompt_ids(2)
        assert _stream_acting_after_four_tokens(url, ids, kill_rank_1, 180) == reference(ids, 48)
        restarted = _worker(supervisor, "decode0")
        assert restarted is not None and restarted.pid != decode0.pid


@pytest.mark.slow
def test_a_frozen_group_is_restarted_whole_and_the_stream_completes(text_checkpoint, tmp_path):
    """``dayzero up --decode-tp 2``; SIGSTOP decode's rank 0 mid-stream (a frozen worker, not a dead
    one): its liveness stamps stop, up SIGKILLs the group, rank 1 with it, after
    DAYZERO_FROZEN_WORKER_S and starts it again; the request is re-run and the client's stream ends
    with the same greedy tokens. A frozen worker was never restarted: the stream crept on by a
    token per handoff timeout (60 s), the re-runs' prefill's. (A Redis frozen past the bound
    restarts nobody: test_frozen_redis_for_up.py. Frozen here, it could not fail without that
    guard: the workers' stamps sent meanwhile landed at SIGCONT with up's read.)"""
    frozen = None
    frozen_s = {"DAYZERO_FROZEN_WORKER_S": "3"}
    with _decode_in_two_ranks(text_checkpoint, tmp_path, frozen_s) as (url, supervisor, reference, stderr):
        try:
            decode0 = _worker(supervisor, "decode0")
            follower = _rank(decode0, 1)

            def freeze_rank_0() -> None:
                nonlocal frozen
                decode0.suspend()
                frozen = decode0

            ids = prompt_ids(2)
            assert _stream_acting_after_four_tokens(url, ids, freeze_rank_0, 60) == reference(ids, 48)
            assert not _alive(decode0) and not _alive(follower)
            restarted = _worker(supervisor, "decode0")
            assert restarted is not None and restarted.pid != decode0.pid
        finally:
            if frozen is not None and _alive(frozen):
                frozen.resume()
    assert "decode0 froze (no liveness stamp for 3 s); restarted" in stderr[0]


@contextmanager
def _decode_in_two_ranks(checkpoint, tmp_path, env: dict[str, str] | None = None):
    """``dayzero up --vision 0 --decode-tp 2`` (``env`` added) on a text ``checkpoint``, ready -> its
    URL, the supervisor, the one-rank engine's greedy completer, and a list that holds what up wrote
    to stderr once it stopped (SIGTERM, on leaving)."""
    reference = engine_completer(checkpoint, "cpu")
    port, stderr = free_port(), []
    up = up_process(checkpoint, tmp_path / "logs", port, "--vision 0 --decode-tp 2", env)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, up)
        yield url, psutil.Process(up.pid), reference, stderr
    finally:
        up.send_signal(signal.SIGTERM)
        stderr.append(up.communicate(timeout=60)[1])


def _stream_acting_after_four_tokens(url: str, ids: list[int], act, timeout_s: float) -> str:
    """A greedy streamed completion of 48 tokens of ``ids``, ``act()`` called after its fourth
    token arrived -> its text."""
    body = {"model": MODEL, "prompt": ids, "max_tokens": 48, "temperature": 0, "ignore_eos": True, "stream": True}
    tokens = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=timeout_s) as r:
        for _, data in sse_events(r):
            if data == "[DONE]":
                break
            tokens.append(data["choices"][0]["text"])
            if len(tokens) == 4:
                act()
    return "".join(tokens)
