"""The prefill loop's steps, in-process against a real Redis: a chunk of each prompt under way per
step, beside the first chunks of newly arrived ones; cancels read between steps."""

from __future__ import annotations

import pytest

from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import DecodeJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from .conftest import recording
from .prefill_jobs import admitted


def _two_long_prompts(demo_dir, redis_url, rids: tuple[str, str], **settings):
    """A prefill loop (``settings``) with two 48-token prompts submitted -> the loop, the store, the
    jobs it sends to decode, the tickets by request id. The loop is not running: a test steps it."""
    runtime = Runtime.load(
        Settings(checkpoint=demo_dir, redis_url=redis_url, **settings), f"{rids[0]}@test", "prefill", False
    )
    sent: list[DecodeJob] = []
    loop, store = PrefillLoop(runtime, recording(sent)), Lifecycle.connect(redis_url)
    tickets = {
        rid: loop.intake.submit(admitted(store, rid, tuple(range(first, first + 48))))
        for rid, first in zip(rids, (10, 60), strict=True)
    }
    return loop, store, sent, tickets


def test_a_short_request_passes_a_long_prompt_in_prefill_and_a_cancelled_one_stops_between_chunks(demo_dir, redis_url):
    """Long prompts are prefilled a chunk per step: a short request arriving meanwhile joins the next
    step and is handed to decode before the long prompt; a long prompt a client cancels stops at
    the next step, its stream ended and its blocks free (the loop runs here, one iteration a step)."""
    loop, store, sent, tickets = _two_long_prompts(demo_dir, redis_url, ("long", "left"), prefill_chunk_size=8)
    runtime = loop.r
    try:
        loop._iteration()  # the first chunk of each
        assert runtime.stats.counters["tokens"] == 16 and not sent
        tickets["short"] = loop.intake.submit(admitted(store, "short"))
        store.cancel("left")
        while not tickets["long"].done.is_set():
            loop._iteration()
    finally:
        loop.stop.set()
    assert [job.request.request_id for job in sent] == ["short", "long"]  # short was not held behind long
    assert store.done("left") == "cancelled" and tickets["left"].done.is_set()
    assert runtime.stats.counters["tokens"] == 48 + 8 + 5  # "left" stopped after its first chunk
    assert set(runtime.pools.sequences) == {"short", "long"}  # leased to decode; "left"'s blocks are free


def test_long_prompts_leave_every_step_room_for_a_short_request_and_a_waiting_one_cancelled_never_runs(
    demo_dir, redis_url
):
    """Steps of two chunks: a long prompt under way keeps the second long one waiting, so that a
    short request arriving meanwhile still joins the next step (both long ones in the step, it
    waited for their ends); the second long one starts when the first ends. A third long one that
    its client cancels while it waits for room ends cancelled, never prefilled (it was prefilled
    once it started: its cancel was read only between the chunks of prompts under way)."""
    ids = ("long-1", "long-2")
    loop, store, sent, tickets = _two_long_prompts(
        demo_dir, redis_url, ids, prefill_chunk_size=8, max_prefill_tokens=16
    )
    runtime = loop.r
    try:
        tickets["gone"] = loop.intake.submit(admitted(store, "gone", tuple(range(110, 158))))
        loop._iteration()
        assert runtime.stats.counters["tokens"] == 8  # long-2 and gone wait for room
        store.cancel("gone")
        tickets["brief"] = loop.intake.submit(admitted(store, "brief"))
        while not tickets["long-2"].done.is_set():
            loop._iteration()
    finally:
        loop.stop.set()
    assert [job.request.request_id for job in sent] == ["brief", "long-1", "long-2"]
    assert runtime.stats.counters["tokens"] == 48 + 48 + 5
    assert store.done("gone") == "cancelled" and tickets["gone"].done.is_set() and not loop.pending
    assert set(runtime.pools.sequences) == {"brief", "long-1", "long-2"}  # leased to decode


@pytest.mark.parametrize(("budget", "steps", "shared"), [(8, 2, [4, 4]), (12, 1, [7, 5])])
def test_a_short_request_passes_a_long_prompt_whose_chunk_fills_the_step(demo_dir, redis_url, budget, steps, shared):
    """A chunk as large as the step (or more than half of it): one long prompt filled every step,
    and a short request arriving meanwhile waited for its last chunk. The long prompt's chunk now
    shrinks to leave the short one room (half the step; in steps of 8, 4 tokens of its 5, then its
    last one): it is handed to decode within ``steps`` steps, the long one going on beside it
    (``shared``: the step's tokens, the short one's last), no step past the budget."""
    whole, after, short = (f"{name}-{budget}" for name in ("whole", "after", "short"))  # (one Redis: ids of its own)
    loop, store, sent, tickets = _two_long_prompts(
        demo_dir, redis_url, (whole, after), prefill_chunk_size=8, max_prefill_tokens=budget
    )
    runtime, real_prefill, steps_run = loop.r, loop.r.ranks.prefill, []

    def prefill(chunks):
        steps_run.append([len(c.tokens) for c in chunks])
        return real_prefill(chunks)

    runtime.ranks.prefill = prefill
    try:
        loop._iteration()  # the first chunk of "whole" fills the step; "after" waits for room
        tickets[short] = loop.intake.submit(admitted(store, short))
        for _ in range(steps):
            loop._iteration()
        assert tickets[short].done.is_set() and not tickets[whole].done.is_set()
        while not tickets[after].done.is_set():
            loop._iteration()
    finally:
        loop.stop.set()
    assert [job.request.request_id for job in sent] == [short, whole, after]
    assert steps_run[:2] == [[8], shared] and all(sum(step) <= budget for step in steps_run)
    assert sum(map(sum, steps_run)) == runtime.stats.counters["tokens"] == 48 + 48 + 5


def test_a_request_cancelled_during_its_last_chunk_streams_nothing_and_is_not_handed_off(demo_dir, redis_url):
    """The client left while the forward ran (a worker SIGSTOPped then wrote the first token on
    SIGCONT and handed the request to decode): neither is done, its blocks are free. A choice of an
    ``n`` = 2 request sharing the forward (the one whose blocks run it) ends so alone; the other
    choice gets the state and goes on."""
    runtime = Runtime.load(Settings(checkpoint=demo_dir, redis_url=redis_url), "cut@test", "prefill", False)
    sent: list[DecodeJob] = []
    loop, store = PrefillLoop(runtime, recording(sent)), Lifecycle.connect(redis_url)
    prompts = {"choice0": (0, 5, 6, 7, 8), "choice1": (0, 5, 6, 7, 8), "alone": (0, 9, 10, 11, 12)}
    tickets = {rid: loop.intake.submit(admitted(store, rid, prompt)) for rid, prompt in prompts.items()}
    real_prefill = runtime.ranks.prefill

    def prefill(chunks):
        for rid in ("choice0", "alone"):
            store.cancel(rid)  # the clients leave during the forward
        return real_prefill(chunks)

    runtime.ranks.prefill = prefill
    try:
        while not all(ticket.done.is_set() for ticket in tickets.values()):
            loop._iteration()
    finally:
        loop.stop.set()
    assert runtime.stats.counters["tokens"] == 10  # the pair's forward ran once, beside "alone"
    assert [job.request.request_id for job in sent] == ["choice1"]
    assert [store.stream(rid) for rid in ("choice0", "alone")] == [([], "cancelled")] * 2
    assert store.done("choice0") == store.done("alone") == "cancelled" and store.owner("choice1") == "handoff"
    assert set(runtime.pools.sequences) == {"choice1"}  # leased to decode


def test_a_long_prompt_starts_past_its_pass_s_while_short_prompts_keep_filling_the_steps(demo_dir, redis_url):
    """Steps of a chunk (8 tokens), an 8-token request arriving at every step after a 1-token one:
    each step ran the last token of one short request and 7 of the next, so a long prompt never had
    its chunk of room and waited while they kept coming (for ever). With DAYZERO_PREFILL_PASS_S
    at 0 it starts at once beside them, its share half of each step, and is handed to decode while
    they still arrive."""
    runtime = Runtime.load(
        Settings(
            checkpoint=demo_dir, redis_url=redis_url, prefill_chunk_size=8, max_prefill_tokens=8, prefill_pass_s=0
        ),
        "passed@test",
        "prefill",
        False,
    )
    sent: list[DecodeJob] = []
    loop, store = PrefillLoop(runtime, recording(sent)), Lifecycle.connect(redis_url)
    loop.intake.submit(admitted(store, "passed-first", (3,)))
    try:
        for step in range(
            1 + 48 // 4 + 4
        ):  # (its 12 steps at half a chunk, a step lost to a loaded scheduler, shorts after)
            loop.intake.submit(admitted(store, f"passed-short-{step}", tuple(range(100 + 8 * step, 108 + 8 * step))))
            if step == 1:
                long = loop.intake.submit(admitted(store, "passed-long", tuple(range(10, 58))))
            loop._iteration()
    finally:
        loop.stop.set()
    handed = [job.request.request_id for job in sent]
    assert long.done.is_set() and "passed-long" in handed
    assert handed.index("passed-long") < len(handed) - 2  # (short ones handed off after it)
