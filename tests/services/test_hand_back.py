"""A stopping worker's hand back against a real Redis: the run it holds is re-run at once (attempt + 1,
from the tokens its stream holds, at the front of prefill's queue), fenced: never a run that is over
or someone else's."""

from __future__ import annotations

import re
import signal
from types import SimpleNamespace

import httpx
import pytest
import redis

from dayzero.params import SamplingParams
from dayzero.serving.hand_back import handing_back
from dayzero.serving.keys import key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.loop_stage import LoopStage
from dayzero.serving.messages import GenerationRequest
from dayzero.serving.reaper import MAX_ATTEMPTS
from dayzero.serving.records import Token
from dayzero.serving.scripts import Take

from .conftest import MODEL, recording, start_stack, stream_killing_its_worker


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
    stuck.hand_back(0)
    ended.hand_back(0)
    assert told == [("r", 3, False), ("r", 3, True)]


def test_a_loop_stage_waits_for_its_kept_handoffs_after_its_hand_back_and_only_once_its_loop_ended():
    """Prefill's stop: its re-runs go to peers first (at once), then it waits for decode's copies of what it
    keeps (``KeptHandoffs.wait_taken``, till the bound it was given); a loop stuck in a step does not wait:
    that loop may still change what it keeps while the wait reads it."""
    told: list = []
    loop = SimpleNamespace(run_forever=lambda: None, hand_back=lambda rerun: rerun("r", 3))
    handoffs = SimpleNamespace(wait_taken=lambda until: told.append(("wait", until)))
    runtime = SimpleNamespace(ranks=SimpleNamespace(stop=lambda: None))
    stuck, ended = (LoopStage(runtime, loop, lambda *run: told.append(run) or True, handoffs) for _ in range(2))
    ended.run_forever()
    stuck.hand_back(7.5)
    ended.hand_back(7.5)
    assert told == [("r", 3, False), ("r", 3, True), ("wait", 7.5)]


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
