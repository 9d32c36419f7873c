"""A stopping worker's hand back against a real Redis: the run it holds is re-run at once (attempt + 1,
from the tokens its stream holds, at the front of prefill's queue), fenced: never a run that is over
or someone else's."""

from __future__ import annotations

import logging
import re
import signal
import sys
import threading
from types import SimpleNamespace

import httpx
import pytest
import redis

from dayzero.params import SamplingParams
from dayzero.serving.decode_loop import DecodeLoop
from dayzero.serving.hand_back import handing_back
from dayzero.serving.keys import key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.loop_stage import LoopStage
from dayzero.serving.messages import GenerationRequest
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.reaper import MAX_ATTEMPTS
from dayzero.serving.records import Token
from dayzero.serving.room import Prefetch, Room, to_prefill
from dayzero.serving.runtime import Runtime
from dayzero.serving.scripts import Take
from dayzero.settings import Settings

from .conftest import MODEL, recording, start_stack, stream_killing_its_worker
from .prefill_jobs import admitted, handed_off, one_sequence_loop


def _generating(store: Lifecycle, rid: str, tokens: list[int]) -> None:
    """Admitted, taken by decode0 (run 0), ``tokens`` on its stream."""
    request = GenerationRequest(request_id=rid, prompt_ids=(0, 5), sampling=SamplingParams(max_tokens=9), created=0.0)
    store.admit(request, [], "", 60)
    assert store.take(rid, 0, "decode0", 30) == Take.CLAIMED
    store.append([Token(rid, i, t, "x") for i, t in enumerate(tokens)], {rid: 0}, "decode0")


def test_a_stopping_worker_re_runs_its_request_at_once_from_the_tokens_streamed_at_prefill_s_front(redis_url):
    store, sent = Lifecycle(redis.Redis.from_url(redis_url)), []
    store.r.delete("prefill")
    store.r.lpush("prefill", "an older message")  # (waiting: the hand back goes before it)
    _generating(store, "h-gen", [7, 8, 9])
    messages = {"prefill": recording(sent, "prefill"), "vision": recording(sent, "vision")}
    rerun = handing_back(store, "decode0", messages, 60, 5)
    assert rerun("h-gen", 0)
    (job,) = sent
    assert (job.request.request_id, job.attempt, job.generated) == ("h-gen", 1, (7, 8, 9))
    assert store.r.lindex("prefill", -1) != b"an older message" and store.r.llen("prefill") == 2  # the next read's
    assert store.owner("h-gen") is None and store.r.get(key("attempt", "h-gen")) == b"1"
    assert store.append([Token("h-gen", 3, 10, "y")], {"h-gen": 0}, "decode0").refused == {"h-gen"}  # its old run
    assert store.r.xlen(key("tokens", "h-gen")) == 3


def test_a_run_over_or_someone_else_s_is_not_handed_back(redis_url):
    store, sent = Lifecycle(redis.Redis.from_url(redis_url)), []
    for rid in ("h-other", "h-rerun", "h-ended"):
        _generating(store, rid, [7])
    store.r.set(key("lease", "h-other"), "decode1")  # its lease lapsed and another worker holds it
    store.r.set(key("attempt", "h-rerun"), 1)  # re-run since
    assert store.settle("h-ended", 0, "decode0", "length", 1)
    rerun = handing_back(store, "decode0", {"prefill": recording(sent, "prefill")}, 60, 5)
    assert [rerun(rid, 0) for rid in ("h-other", "h-rerun", "h-ended")] == [False, False, False] and not sent
    assert [int(store.r.get(key("attempt", rid)) or 0) for rid in ("h-other", "h-rerun")] == [0, 1]
    assert store.owner("h-other") == "decode1"


def test_a_clean_stop_s_hand_back_is_no_failed_run(redis_url):
    """A rolling restart: each worker the request lands on stops, its loop ended, and hands it back. Each
    hand back counted as a failed run: the fifth stop ended it with "the request failed on several
    workers". Spared, they count no more; a frozen worker's (its loop stuck in a step) still do."""
    store, sent = Lifecycle(redis.Redis.from_url(redis_url)), []
    messages = {"prefill": recording(sent, "prefill")}
    _generating(store, "h-roll", [7])
    runs, handed = 0, True
    while handed:
        if runs:
            assert store.take("h-roll", runs, f"decode{runs}", 30) == Take.CLAIMED
        handed = handing_back(store, f"decode{runs}", messages, 60, 5)("h-roll", runs, runs <= MAX_ATTEMPTS + 1)
        runs += 1
    spared = MAX_ATTEMPTS + 2
    assert (runs, store.spared("h-roll")) == (spared + MAX_ATTEMPTS + 1, spared)  # then MAX_ATTEMPTS re-runs
    assert store.done("h-roll") == "error" and len(sent) == spared + MAX_ATTEMPTS


def test_a_spared_count_lives_as_the_record_then_as_the_stream(redis_url):
    """The count of a request's spared runs lives as its record while it runs, and is shortened with it
    (and its attempt) to the stream's life when it ends: it lived on for the record's whole life (here
    4 min against the stream's 1, 40 against 10 by default), a key per request a rolling restart handed back."""
    store, sent = Lifecycle(redis.Redis.from_url(redis_url), stream_ttl_s=60), []
    _generating(store, "h-life", [7])
    assert handing_back(store, "decode0", {"prefill": recording(sent, "prefill")}, 60, 5)("h-life", 0, True)
    record_s = store.r.ttl(key("req", "h-life"))
    assert record_s > 60 and record_s - 2 <= store.r.ttl(key("spared", "h-life")) <= record_s
    assert store.take("h-life", 1, "decode1", 30) == Take.CLAIMED and store.settle("h-life", 1, "decode1", "length", 1)
    assert 0 < store.r.ttl(key("spared", "h-life")) <= store.r.ttl(key("req", "h-life")) <= 60


def test_a_loop_stage_spares_the_runs_of_a_loop_that_ended():
    """What a stopping worker's loop stage tells its hand back: spared once its loop ended, not while
    the loop is stuck in a step (the join gave up on it)."""
    told: list = []
    loop = SimpleNamespace(run_forever=lambda: None, hand_back=lambda rerun: rerun("r", 3))
    runtime = SimpleNamespace(ranks=SimpleNamespace(stop=lambda: None))
    stuck, ended = (LoopStage(runtime, loop, lambda *run: told.append(run) or True) for _ in range(2))
    ended.run_forever()
    stuck.hand_back()
    ended.hand_back()
    assert told == [("r", 3, False), ("r", 3, True)]


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


@pytest.fixture(scope="module")
def stack(text_dir, tmp_path_factory):
    """Two decode workers: one stopped mid-stream, the other continues its request."""
    s = start_stack(text_dir, tmp_path_factory.mktemp("logs"), {"vision": 0, "prefill": 1, "decode": 2})
    yield s
    s.stop()


def test_a_decode_worker_stopped_mid_stream_hands_its_request_to_its_peer_before_it_ends(stack):
    """SIGTERM (a rolling restart, a scale-down): the worker stepped on through Celery's warm shutdown
    for the grace (5 s), exited, and its request went on only once its lease lapsed and a sweep re-ran
    it ("lost its worker", the gateway's reaper). Now the stopping worker re-runs it itself, before it
    ends (its own log says so), and the stream reads on, equal to an undisturbed run's."""
    body = {"model": MODEL, "prompt": [0, 9, 8, 7, 6], "max_tokens": 160, "temperature": 0, "ignore_eos": True}
    expected = httpx.post(f"{stack.url}/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]
    text, ids, stopped = stream_killing_its_worker(stack, body, after=10, sig=signal.SIGTERM)
    assert stopped is not None and stopped.name.startswith("decode")
    assert text == expected  # nothing lost, nothing repeated
    assert ids == sorted(set(ids)) and ids[-1] == 160
    assert stopped.proc.wait(30) == 0
    handed = re.findall(
        r"request (\S+) was handed back by its stopping worker", (stack.log_dir / f"{stopped.name}.log").read_text()
    )
    assert len(handed) == 1  # by the stopping process, in its life (not the reaper's re-run after its end)
    assert f"request {handed[0]} lost its worker" not in (stack.log_dir / "gateway.log").read_text()
