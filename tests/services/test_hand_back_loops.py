"""A stopping worker's hand back from inside its loops (a real Redis, in-process prefill and decode
loops): the prompts a prefill step holds or handed to peers, a delivery claimed after the hand back,
and decode steps abandoned at the stop or ending during the hand back."""

from __future__ import annotations

import logging
import sys
import threading

from dayzero.serving.decode_loop import DecodeLoop
from dayzero.serving.hand_back import handing_back
from dayzero.serving.keys import key
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.room import Prefetch, Room, to_prefill
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from .conftest import recording
from .prefill_jobs import admitted, handed_off, one_sequence_loop


def test_a_stopping_prefill_worker_re_runs_the_prompts_it_claimed(demo_dir, redis_url):
    """Claimed, not prefilled yet (waiting in its intake): each re-run at once at prefill's front, its task
    ended; their leases were left to lapse and a sweep."""
    loop, _ = one_sequence_loop(demo_dir, redis_url, "prefill40@test")
    store, sent, name = loop.r.store, [], loop.r.name
    store.r.delete("prefill")
    tickets = [loop.intake.submit(admitted(store, rid)) for rid in ("h-p1", "h-p2")]
    assert [store.owner(rid) for rid in ("h-p1", "h-p2")] == [name, name]  # (claimed)
    loop.stop.set()  # (its loop, never run, ended)
    loop.hand_back(handing_back(store, name, {"prefill": recording(sent, "prefill")}, 60, 5))
    assert [(job.request.request_id, job.attempt, job.generated) for job in sent] == [("h-p1", 1, ()), ("h-p2", 1, ())]
    assert all(ticket.done.is_set() for ticket in tickets) and store.r.llen("prefill") == 2
    assert [store.owner(rid) for rid in ("h-p1", "h-p2")] == [None, None]


def test_a_delivery_claimed_after_the_hand_back_is_handed_back_too(demo_dir, redis_url):
    """A task thread whose message came as the stop did claims it after the loop handed back what it held:
    it waited in an intake no loop drains (its task held the warm shutdown to the grace, its lease left
    to lapse for a sweep). Now it is re-run at once on that thread, its task ended."""
    loop, _ = one_sequence_loop(demo_dir, redis_url, "prefill42@test")
    store, sent, name = loop.r.store, [], loop.r.name
    store.r.delete("prefill")
    loop.stop.set()
    loop.hand_back(handing_back(store, name, {"prefill": recording(sent, "prefill")}, 60, 5))
    ticket = loop.intake.submit(admitted(store, "h-late"))
    assert ticket.done.is_set() and [(job.request.request_id, job.attempt) for job in sent] == [("h-late", 1)]
    assert store.owner("h-late") is None and store.r.llen("prefill") == 1


def test_a_stopping_prefill_worker_lets_go_of_what_it_handed_to_a_peer(demo_dir, redis_url):
    """A prompt its Room handed to a peer with room keeps its task (its message held a while, let go by
    the loop's next ``consume``): with the loop ended nothing let it go, and Celery's warm shutdown
    waited for it till the grace (decode's hand back let go of its own). Now its task ends with the rest."""
    runtime = Runtime.load(Settings(checkpoint=demo_dir, redis_url=redis_url), "prefill43@test", "prefill", False)
    pushed, sent = [], []
    room = Room(runtime, Prefetch(), to_prefill(runtime, recording(pushed, "prefill")))
    loop, store = PrefillLoop(runtime, recording([]), room), runtime.store
    ticket = loop.intake.submit(admitted(store, "h-held"))
    assert loop.intake.drain(0) == [ticket] and room._hand_back(ticket, loop.heartbeat)  # (Room.share's)
    loop.stop.set()
    loop.hand_back(handing_back(store, runtime.name, {"prefill": recording(sent, "prefill")}, 60, 5))
    assert ticket.done.is_set() and len(pushed) == 1 and not sent  # (the peer's now: not re-run)
    runtime.close()


def test_a_stopping_prefill_worker_re_runs_the_prompt_its_abandoned_step_holds(demo_dir, redis_url):
    """A forward still under way past LOOP_END_S (its step abandoned): its prompt, out of ``running`` for
    the step, was not handed back (its lease left to lapse, its task to the grace), and the step, once
    it returned, streamed its first token and handed it off to decode, its state in the blocks of a
    process about to exit. Now it is re-run at once, and what the step writes after is stale."""
    loop, to_decode = one_sequence_loop(demo_dir, redis_url, "prefill41@test")
    store, sent, name = loop.r.store, [], loop.r.name
    store.r.delete("prefill")
    entered, release, forward = threading.Event(), threading.Event(), loop.r.ranks.prefill

    def held_forward(chunks):
        entered.set()
        release.wait(60)
        return forward(chunks)

    loop.r.ranks.prefill = held_forward
    ticket = loop.intake.submit(admitted(store, "h-p3"))
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    assert entered.wait(60)
    loop.stop.set()  # (the forward under way: the stop's join gave up on it)
    loop.hand_back(handing_back(store, name, {"prefill": recording(sent, "prefill")}, 60, 5))
    release.set()
    thread.join(60)
    assert [(job.request.request_id, job.attempt) for job in sent] == [("h-p3", 1)] and ticket.done.is_set()
    assert store.r.xlen(key("tokens", "h-p3")) == 0 and not to_decode  # the old run's first token and handoff
    assert store.owner("h-p3") is None


def test_a_stop_between_a_step_s_plan_and_its_forward_re_runs_the_step_s_prompts(demo_dir, redis_url):
    """The hand back comes as the loop thread has just taken the step's prompts out of ``running``
    (the join gave up on it): they were in no list the hand back reads, ``stepping`` not set yet, so
    they were left to their leases' lapse and their tasks to the grace. Held there by a tracer."""
    loop, to_decode = one_sequence_loop(demo_dir, redis_url, "prefill44@test")
    store, sent, name = loop.r.store, [], loop.r.name
    store.r.delete("prefill")
    between, release = threading.Event(), threading.Event()

    def in_step(frame, event, _):  # a line of ``_step`` once its prompts are out of ``running``: held once
        rows = frame.f_locals.get("rows")
        if event == "line" and rows and not between.is_set() and not any(p is q for p in rows for q in loop.running):
            between.set()
            release.wait(60)
        return in_step

    def traced():
        sys.settrace(lambda frame, *_: in_step if frame.f_code is PrefillLoop._step.__code__ else None)
        loop.run_forever()

    ticket = loop.intake.submit(admitted(store, "h-p4"))
    thread = threading.Thread(target=traced)
    thread.start()
    try:
        assert between.wait(60)
        loop.stop.set()
        loop.hand_back(handing_back(store, name, {"prefill": recording(sent, "prefill")}, 60, 5))
    finally:
        release.set()
        thread.join(60)
    assert [(job.request.request_id, job.attempt) for job in sent] == [("h-p4", 1)] and ticket.done.is_set()
    assert not to_decode and store.owner("h-p4") is None


def _decode_held_at_third_step(demo_dir, redis_url, name: str, rids: tuple[str, ...], max_tokens: int):
    """A decode loop over ``rids`` (prefilled, handed off through Redis) on its thread, held in its third
    step (two tokens decoded and streamed after prefill's). -> the store, the loop, its tickets, its
    thread, the step's release, each step's requests."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store, jobs = handed_off(settings, rids, max_tokens=max_tokens)
    runtime = Runtime.load(settings, name, "decode", False)
    loop, entered, release, steps = DecodeLoop(runtime), threading.Event(), threading.Event(), []
    decode = runtime.ranks.decode

    def held_step(ids, tokens):
        steps.append(ids)
        if len(steps) == 3:
            entered.set()
            release.wait(60)
        return decode(ids, tokens)

    runtime.ranks.decode = held_step
    tickets = [loop.intake.submit(job) for job in jobs]
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    assert entered.wait(60)
    return store, loop, tickets, thread, release, steps


def test_a_decode_step_abandoned_at_the_stop_ends_without_failing(demo_dir, redis_url, caplog):
    """A decode step still under way past LOOP_END_S: its batch is handed back under it (``active``
    emptied). Its end read the emptied batch (a KeyError) and logged a failed decode step, counted as
    one (the worker's failures metric); now it ends as it is: stale, its tokens never appended."""
    store, loop, tickets, thread, release, _ = _decode_held_at_third_step(
        demo_dir, redis_url, "decode40@test", ("h-d1",), 50
    )
    runtime = loop.r
    loop.stop.set()
    sent: list = []
    loop.hand_back(handing_back(store, runtime.name, {"prefill": recording(sent, "prefill")}, 60, 5))
    release.set()
    thread.join(60)
    streamed = tuple(store.stream("h-d1")[0])
    assert len(streamed) == 3 and [(job.attempt, job.generated) for job in sent] == [(1, streamed)]
    assert all(ticket.done.is_set() for ticket in tickets)
    assert runtime.stats.snapshot()["failures"] == {}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    runtime.close()


def test_a_decode_step_that_ends_during_the_hand_back_leaves_it_whole(demo_dir, redis_url):
    """The abandoned step returns while the hand back walks the batch (its spans' ends: an exporter's
    moment) and ends two requests, out of ``active``: the walk raised "dictionary changed size during
    iteration" out of the SIGTERM handler, before the intake was closed or anything handed back."""
    rids = ("h-d2", "h-d3")  # (4 tokens: the held step is their last)
    store, loop, tickets, thread, release, steps = _decode_held_at_third_step(
        demo_dir, redis_url, "decode41@test", rids, 4
    )
    runtime = loop.r
    assert len(steps[-1]) == 2
    batch, first = loop.active, next(iter(loop.active.values()))

    class Exporting:  # the first span's end: the step returns meanwhile, and ends what it ends
        def __init__(self, span):
            self.span = span

        def __getattr__(self, name):
            return getattr(self.span, name)

        def end(self):
            release.set()
            ended = threading.Event()
            while len(batch) == 2 and thread.is_alive() and not ended.wait(0.01):
                pass
            self.span.end()

    first.span = Exporting(first.span)
    loop.stop.set()
    sent: list = []
    try:
        loop.hand_back(handing_back(store, runtime.name, {"prefill": recording(sent, "prefill")}, 60, 5))
    finally:
        release.set()
        thread.join(60)
        runtime.close()
    assert all(ticket.done.is_set() for ticket in tickets)
    assert [store.owner(rid) for rid in ("h-d2", "h-d3")] == [None, None]
    assert all(store.done(rid) or any(job.request.request_id == rid for job in sent) for rid in ("h-d2", "h-d3"))
