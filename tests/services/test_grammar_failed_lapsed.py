"""A request's own failure (its grammar's, here) is counted by the run that writes its end: where its
lease lapsed as it failed (its worker stalled, the reaper re-ran it), that run's end is STALE, never
written, and the re-run's end (the client's one 400) is counted where it is written. The loops run
in-process on a real Redis and a real runtime."""

from __future__ import annotations

import logging
import time

from dayzero.chat.grammar import json_grammar
from dayzero.params import Grammar, SamplingParams
from dayzero.serving.decode_loop import DecodeLoop
from dayzero.serving.keys import key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import DecodeJob, GenerationRequest, PrefillJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from ..grammar_cases import AB_PATTERN, FAILING_LATE, LATE_PATTERN
from .conftest import prompt_ids, recording, run_jobs
from .test_grammar_failed import _last, _prefilled


def _lapse(store: Lifecycle, rid: str) -> int:
    """``rid``'s lease lapses and the reaper re-runs it: -> the re-run's attempt."""
    store.r.delete(key("lease", rid))
    return store.rerun_orphan(rid, 60, 60)


def _lapsing_as_it_settles(runtime: Runtime, store: Lifecycle, rid: str) -> list[int]:
    """``runtime``'s settle of ``rid`` finds its lease lapsed and the request re-run (``_lapse``): -> the
    re-runs' attempts, as they happen."""
    settle, reruns = runtime.store.settle, []

    def lapsed(*args, **kwargs):
        reruns.append(_lapse(store, rid))
        return settle(*args, **kwargs)

    runtime.store.settle = lapsed
    return reruns


def _decoded_lapsing_as_it_fails(runtime: Runtime, store: Lifecycle, rid: str, jobs: list[DecodeJob]) -> list[int]:
    """``jobs`` decoded on ``runtime``, ``rid``'s lease lapsing and the request re-run (``_lapse``) as the
    append after the step that ended it goes out (its failure's): -> the re-runs' attempts."""
    loop, append, reruns = DecodeLoop(runtime), runtime.store.append, []

    def lapsed(tokens, *args):
        if not reruns and any(active.end is not None for active in loop.active.values()):
            reruns.append(_lapse(store, rid))
        return append(tokens, *args)

    runtime.store.append = lapsed
    run_jobs(loop, jobs)
    return reruns


def test_a_grammar_failing_in_a_run_whose_lease_was_lost_is_counted_by_its_re_run_alone(demo_dir, redis_url):
    """Its lease lapses as its step fails (this worker stalled; the reaper re-runs it): this run's end
    is never written (its settle STALE), the re-run's is (the client's one 400), and counted there.
    This worker counted it too (as it failed; before, as it settled it): one failure counted twice."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store, rid = Lifecycle.connect(redis_url), "late-lapsed"
    sampling = SamplingParams(max_tokens=400, temperature=1.0, seed=3, grammar=Grammar(json_grammar(LATE_PATTERN)))
    sent = _prefilled(settings, store, rid, sampling, 0)
    stale = Runtime.load(settings, "decode-stale@test", "decode", False)
    reruns = _decoded_lapsing_as_it_fails(stale, store, rid, sent)
    assert reruns[0] > 0 and store.done(rid) is None
    rerun: list[DecodeJob] = []
    job = PrefillJob(request=sent[0].request, generated=tuple(store.streamed_tokens(rid)), attempt=reruns[0])
    prefill = Runtime.load(settings, "prefill-rerun@test", "prefill", False)
    run_jobs(PrefillLoop(prefill, recording(rerun)), [job])
    decode = Runtime.load(settings, "decode-rerun@test", "decode", False)
    run_jobs(DecodeLoop(decode), rerun)
    assert (store.done(rid), _last(store, rid)[b"c"]) == ("error", b"grammar_failed")
    counts = [r.stats.snapshot()["counters"].get("grammar_failures") for r in (stale, prefill, decode)]
    assert counts == [0, 0, 1], counts  # (the re-run fails as decode samples: its prefill samples nothing)


def test_a_grammar_failing_in_prefill_as_its_lease_lapsed_is_counted_by_its_re_run_alone(demo_dir, redis_url):
    """Prefill's first token fails its grammar (a required property that is its own object) as its
    lease lapses: its end is STALE, and the re-run, failing alike, ends it: one grammar failure."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store, rid = Lifecycle.connect(redis_url), "first-lapsed"
    sampling = SamplingParams(max_tokens=8, grammar=Grammar(json_grammar(FAILING_LATE[0])))
    request = GenerationRequest(request_id=rid, prompt_ids=tuple(prompt_ids(1)), sampling=sampling, created=time.time())
    store.admit(request, [], "", 60)
    stale = Runtime.load(settings, "prefill-stale@test", "prefill", False)
    reruns = _lapsing_as_it_settles(stale, store, rid)
    run_jobs(PrefillLoop(stale, recording([])), [PrefillJob(request=request)])
    assert reruns[0] > 0 and store.done(rid) is None
    rerun = Runtime.load(settings, "prefill-rerun2@test", "prefill", False)
    run_jobs(PrefillLoop(rerun, recording([])), [PrefillJob(request=request, attempt=reruns[0])])
    assert (store.done(rid), _last(store, rid)[b"c"]) == ("error", b"grammar_failed")
    counts = [r.stats.snapshot()["counters"].get("grammar_failures") for r in (stale, rerun)]
    assert counts == [0, 1], counts


def test_a_replay_its_grammar_refuses_at_admission_as_its_lease_lapsed_counts_nothing_here(demo_dir, redis_url):
    """A streamed token its grammar refuses fails it at decode's admission (decode's failure) as its
    lease lapses: its end is STALE, nothing counted here (its re-run's end counts it)."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store, rid = Lifecycle.connect(redis_url), "refused-lapsed"
    sampling = SamplingParams(max_tokens=8, grammar=Grammar(json_grammar(AB_PATTERN)))
    (job,) = _prefilled(settings, store, rid, sampling, 3)
    decode = Runtime.load(settings, "decode-refused-lapsed@test", "decode", False)
    reruns = _lapsing_as_it_settles(decode, store, rid)
    refused = decode.codec.grammars.tokenizer.tokenize_str("x")  # (the reply opens with '"')
    run_jobs(DecodeLoop(decode), [job.model_copy(update={"generated": tuple(refused)})])
    assert reruns[0] > 0 and store.done(rid) is None
    snapshot = decode.stats.snapshot()
    assert (snapshot["counters"].get("grammar_failures"), snapshot["failures"].get("decode", 0)) == (0, 0), snapshot


def test_a_server_error_in_a_run_whose_lease_lapsed_is_logged_not_counted(demo_dir, redis_url, caplog):
    """The handoff fails (a server error: the worker's bug, not the request's) as its lease lapses: its
    end is STALE (the re-run's end counts), but the error and its stack are logged here all the same.
    Counted only where the settle wrote, it was logged only there too: the stale worker's error vanished."""
    caplog.set_level(logging.INFO, logger="dayzero.prefill")
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store, rid = Lifecycle.connect(redis_url), "export-lapsed"
    request = GenerationRequest(
        request_id=rid, prompt_ids=tuple(prompt_ids(1)), sampling=SamplingParams(max_tokens=8), created=time.time()
    )
    store.admit(request, [], "", 60)
    stale = Runtime.load(settings, "prefill-export-lapsed@test", "prefill", False)
    reruns = _lapsing_as_it_settles(stale, store, rid)

    def broken(job: DecodeJob) -> str:
        raise RuntimeError("export broke")

    run_jobs(PrefillLoop(stale, broken), [PrefillJob(request=request)])
    assert reruns[0] > 0 and store.done(rid) is None
    assert stale.stats.snapshot()["failures"].get("prefill", 0) == 0
    logged = [r for r in caplog.records if rid in r.getMessage() and r.levelno == logging.ERROR]
    assert [r.exc_info[1].args for r in logged] == [("export broke",)], [r.getMessage() for r in caplog.records]


def test_a_sampling_error_in_a_decode_run_found_re_run_is_logged_not_counted(demo_dir, redis_url, monkeypatch, caplog):
    """A decode step's sampling raises (a server error) as the request's lease lapses and the reaper
    re-runs it: this run's settle is STALE, nothing counted here, but the error and its stack are
    logged (c7bdd19 moved its log from the failing step to ``_finish``'s written end: a stale run's
    error left no line)."""
    from dayzero.completion import Completion

    caplog.set_level(logging.INFO, logger="dayzero.decode")
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store, rid = Lifecycle.connect(redis_url), "sampling-lapsed"
    sent = _prefilled(settings, store, rid, SamplingParams(max_tokens=8, ignore_eos=True), 0)
    emit = Completion.emit

    def broken(self, token, logits):
        if self.count >= 3:
            raise RuntimeError("sampling broke")
        return emit(self, token, logits)

    monkeypatch.setattr(Completion, "emit", broken)
    stale = Runtime.load(settings, "decode-sampling-lapsed@test", "decode", False)
    reruns = _decoded_lapsing_as_it_fails(stale, store, rid, sent)
    assert reruns[0] > 0 and store.done(rid) is None
    assert stale.stats.snapshot()["failures"].get("decode", 0) == 0
    logged = [r for r in caplog.records if rid in r.getMessage() and r.levelno == logging.ERROR]
    assert [r.exc_info[1].args for r in logged] == [("sampling broke",)], [r.getMessage() for r in caplog.records]
