"""The prefill loop's step plan alone (no model, no Redis): which waiting prompts start and the chunk
each prompt under way prefills in a step, over chunk sizes up to the whole step."""

from __future__ import annotations

import math
import time

import pytest

from dayzero.params import SamplingParams
from dayzero.serving.intake import Ticket
from dayzero.serving.messages import GenerationRequest, PrefillJob
from dayzero.serving.prefill_batch import BatchInput
from dayzero.serving.prefilling import Prefilling, plan_step, take_batch


def _ticket(rid: str, length: int, created: float) -> Ticket[PrefillJob]:
    prompt = (*range(length), *map(ord, rid))[-length:]  # (distinct prompts: none shares a forward)
    request = GenerationRequest(request_id=rid, prompt_ids=prompt, sampling=SamplingParams(), created=created)
    return Ticket(PrefillJob(request=request))


def _run(
    arrivals: dict[int, list[tuple[str, int]]], chunk: int, budget: int, pass_s: float = math.inf
) -> tuple[dict[str, int], list[int]]:
    """Step the plan as the loop does, ``arrivals[step]``: the (id, length) of the prompts arriving
    before that step (admitted at its time: a step is a second) -> the step each prompt ended in,
    and each step's tokens (checking its chunks)."""
    pending: list[Ticket[PrefillJob]] = []
    running: list[Prefilling] = []
    ended: dict[str, int] = {}
    totals: list[int] = []
    step, origin = 0, time.time()
    while step <= max(arrivals) or pending or running:
        pending += [_ticket(rid, length, origin + step) for rid, length in arrivals.get(step, [])]
        for ticket in take_batch(pending, running, chunk, budget, pass_s, now=origin + step):
            job = ticket.job
            running.append(Prefilling([ticket], BatchInput(job.request.request_id, list(job.request.prompt_ids)), []))
        rows, chunks = plan_step(running, chunk, budget)
        assert rows or not running, "prompts under way, none in the step"
        for p, c in zip(rows, chunks, strict=True):
            assert c.tokens == p.input.tokens[p.prefilled : p.prefilled + len(c.tokens)]  # its next tokens
            assert 0 < len(c.tokens) <= chunk
            p.prefilled += len(c.tokens)
            if not p.left:
                ended[p.input.seq_id] = step
        running = [p for p in running if p.left]
        totals.append(sum(len(c.tokens) for c in chunks))
        step += 1
        assert step < 10_000
    return ended, totals


@pytest.mark.parametrize(("chunk", "budget"), [(8, 8), (8, 9), (8, 12), (8, 16), (8, 64), (64, 64), (33, 64), (1, 2)])
def test_a_short_prompt_ends_within_two_steps_of_its_arrival_beside_long_ones_whatever_the_chunk(chunk, budget):
    """Two long prompts under way (the second waiting for room when a chunk is more than half the
    step): a prompt of at most a chunk arriving meanwhile ends within two steps, the long prompts
    still end, the first one before the second, and no step passes the budget."""
    short = min(chunk, max(1, budget // 2 + 1))  # (more than half the step when it can: cut in two)
    ended, totals = _run({0: [("long-1", 20 * budget), ("long-2", 10 * budget)], 2: [("short", short)]}, chunk, budget)
    assert ended["short"] <= 3 and set(ended) == {"long-1", "long-2", "short"}
    assert max(totals) <= budget and sum(totals) == 30 * budget + short


@pytest.mark.parametrize(("chunk", "budget"), [(8, 8), (8, 12), (2048, 8192)])
def test_short_prompts_arriving_at_every_step_leave_the_long_prompt_its_share(chunk, budget):
    """A stream of short prompts filling their room at every step does not stop a long prompt under
    way: it keeps ``budget - min(chunk, budget // 2)`` of each step (the short ones half of it at
    least) and ends in as many steps as that share allows."""
    length, share = 20 * budget, budget - min(chunk, budget // 2)
    arrivals = {step: [(f"short-{step}-{i}", chunk) for i in range(4)] for step in range(1, 40)}
    ended, totals = _run({0: [("long", length)], **arrivals}, chunk, budget)
    assert ended["long"] <= -(-length // min(chunk, share)) + 1
    assert max(totals) <= budget


def test_prompts_of_a_chunk_at_the_defaults_start_as_before():
    """The defaults (chunks of 2048 in steps of 8192): three long prompts at a time, the room of a
    chunk left to a newly arrived one, whole chunks."""
    ended, totals = _run({0: [(f"long-{i}", 5000) for i in range(4)], 1: [("short", 100)]}, 2048, 8192)
    assert totals[:2] == [3 * 2048, 3 * 2048 + 100] and ended["short"] == 1
    assert ended["long-3"] > ended["long-0"]


@pytest.mark.parametrize(("chunk", "budget", "length", "per_step", "first"), [(8, 8, 8, 1, 1), (8, 12, 6, 2, 5)])
def test_short_prompts_pass_a_waiting_long_one_for_its_pass_s_only(chunk, budget, length, per_step, first):
    """A chunk more than half the step: a long prompt waits to start while the short ones under way
    leave it less than a chunk. Short prompts arriving at every step as many tokens as a step holds
    (after a ``first`` one), each cut where the step ends, always left the next ones' first tokens
    under way: the long one started only once their stream ended (60 steps). With
    DAYZERO_PREFILL_PASS_S of 5 steps those arriving meanwhile still pass it; then it starts and
    ends in as many steps as its share of a step (``budget`` less half of it) allows, while they
    keep arriving."""
    shorts = {step: [(f"short-{step}-{i}", length) for i in range(per_step)] for step in range(60)}
    arrivals = {**shorts, 0: [("first", first), *shorts[0]], 1: [("long", 40), *shorts[1]]}
    unbounded, _ = _run(arrivals, chunk, budget)
    assert unbounded["long"] > 60
    ended, totals = _run(arrivals, chunk, budget, pass_s=5)
    assert ended["long"] <= 1 + 5 + -(-40 // (budget - budget // 2)) + 1
    assert ended["short-3-0"] < ended["long"] and max(totals) <= budget
