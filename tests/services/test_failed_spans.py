"""A failure marks its stage's span: status ERROR with why (``prefill.forward``,
``decode.generate``), and a failed forward still ends its batch's spans; its log line names the
requests it fails; the operator counters count each call once, each failure once. The loops run
in-process on a real Redis and a real runtime; their spans are kept in memory."""

from __future__ import annotations

import time

import pytest
import redis
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dayzero.chat.grammar import json_grammar
from dayzero.guided import GRAMMAR_FAILED
from dayzero.params import Grammar, SamplingParams
from dayzero.serving import active, first_tokens, kept_handoffs, prefilling
from dayzero.serving.decode_loop import DecodeLoop
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import DecodeJob, GenerationRequest, PrefillJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from ..grammar_cases import FAILING_LATE, LATE_PATTERN
from .conftest import prompt_ids, recording, run_jobs
from .test_one_fails_alone import POISON


@pytest.fixture
def exported(monkeypatch) -> InMemorySpanExporter:
    exporter, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    for module in (kept_handoffs, prefilling, active, first_tokens):
        monkeypatch.setattr(module, "tracer", provider.get_tracer("test"))
    return exporter


def _admitted(store: Lifecycle, name: str, samplings: list[SamplingParams]) -> list[PrefillJob]:
    jobs = []
    for i, sampling in enumerate(samplings):
        request = GenerationRequest(
            request_id=f"{name}-{i}", prompt_ids=tuple(prompt_ids(i)), sampling=sampling, created=time.time()
        )
        store.admit(request, [], "", 60)
        jobs.append(PrefillJob(request=request))
    return jobs


def _statuses(exporter: InMemorySpanExporter, name: str) -> dict[str, tuple[str, str | None]]:
    """Request id -> (status code, description) of its ``name`` spans."""
    return {
        s.attributes["dayzero.request_id"]: (s.status.status_code.name, s.status.description)
        for s in exporter.get_finished_spans()
        if s.name == name
    }


def _operator_counts(runtime: Runtime, op: str) -> tuple[int, int]:
    """``dayzero_operator_calls_total`` and ``dayzero_operator_failures_total`` of ``op``."""
    return runtime.stats.calls[op], runtime.stats.failures[op]


def _boom(*_args, **_kwargs):
    raise RuntimeError("the device fell over")


def test_failures_set_their_spans_status_and_name_their_requests(demo_dir, redis_url, exported, monkeypatch, caplog):
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store = Lifecycle.connect(redis_url)
    prefill_rt = Runtime.load(settings, "prefill8@test", "prefill", False)
    decode_rt = Runtime.load(settings, "decode8@test", "decode", False)
    fine = SamplingParams(max_tokens=4, ignore_eos=True)
    for runtime in (prefill_rt, decode_rt):  # (compiled, refused: the loops admit a request once its grammar
        runtime.codec.grammars.matcher(POISON.grammar.lark)  # is, so POISON shares its batch with the others)

    # one request's own sampling fails: its span alone is marked; one call, one failure
    sent: list[DecodeJob] = []
    before = _operator_counts(prefill_rt, "prefill")
    run_jobs(PrefillLoop(prefill_rt, recording(sent)), _admitted(store, "own", [fine, POISON, fine]))
    assert _operator_counts(prefill_rt, "prefill") == (before[0] + 1, before[1] + 1)
    assert _statuses(exported, "prefill.forward") == {
        "own-0": ("UNSET", None),
        "own-1": ("ERROR", "failed after prefill: ValueError"),
        "own-2": ("UNSET", None),
    }

    # decode's step fails: every request of the batch fails, each span says why
    monkeypatch.setattr(decode_rt.ranks, "decode", _boom)
    before = _operator_counts(decode_rt, "decode")
    run_jobs(DecodeLoop(decode_rt), sent)
    assert _operator_counts(decode_rt, "decode") == (before[0] + 1, before[1] + 1)
    assert "own-0" in caplog.text and "own-2" in caplog.text
    assert _statuses(exported, "decode.generate") == {
        "own-0": ("ERROR", "decode failed: RuntimeError"),
        "own-2": ("ERROR", "decode failed: RuntimeError"),
    }

    # the batch's forward fails: its spans end all the same (they were never ended, never exported)
    exported.clear()
    caplog.clear()
    monkeypatch.setattr(prefill_rt.ranks, "prefill", _boom)
    before = _operator_counts(prefill_rt, "prefill")
    run_jobs(PrefillLoop(prefill_rt, recording([])), _admitted(store, "batch", [fine, fine]))
    assert _operator_counts(prefill_rt, "prefill") == (before[0] + 1, before[1] + 1)
    assert _statuses(exported, "prefill.forward") == {
        "batch-0": ("ERROR", "prefill failed: RuntimeError"),
        "batch-1": ("ERROR", "prefill failed: RuntimeError"),
    }
    assert store.done("batch-0") == store.done("batch-1") == "error"
    assert "batch-0" in caplog.text and "batch-1" in caplog.text


def test_a_first_token_sent_again_has_a_resend_span_per_try(demo_dir, redis_url, exported):
    """Redis refuses a prompt's first append, then its first retry: its ``prefill.forward`` ends with the
    refusal, and each retry is a ``prefill.resend`` span of its own (it had none: the retries, and the
    handoff's ``kv.export`` under them, were nowhere in the trace), ERROR while refused."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    runtime, store = Runtime.load(settings, "prefill-resend@test", "prefill", False), Lifecycle.connect(redis_url)
    tries, real_append = [], runtime.store.append

    def refused_twice(tokens, *args):
        tries.append(tokens)
        if len(tries) <= 2:
            raise redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'.")
        return real_append(tokens, *args)

    runtime.store.append = refused_twice
    run_jobs(PrefillLoop(runtime, recording([])), _admitted(store, "resent", [SamplingParams(max_tokens=4)]))
    spans = {
        name: [s for s in exported.get_finished_spans() if s.name == name]
        for name in ("prefill.forward", "prefill.resend")
    }
    assert [(s.status.status_code.name, s.attributes["dayzero.request_id"]) for s in spans["prefill.forward"]] == [
        ("ERROR", "resent-0")
    ]
    resends = spans["prefill.resend"]
    assert [s.status.status_code.name for s in resends] == ["ERROR", "UNSET"] and len(tries) == 3
    assert all(
        s.attributes["dayzero.request_id"] == "resent-0" and s.attributes["dayzero.attempt"] == 0 for s in resends
    )
    assert not resends[-1].attributes["dayzero.first_token_streamed"]
    export = [s for s in exported.get_finished_spans() if s.name == "kv.export"]
    assert [s.parent.span_id for s in export] == [resends[-1].context.span_id]  # the handoff, in the retry that sent it
    runtime.close()


def test_a_schema_failing_its_grammar_marks_no_span_an_error(demo_dir, redis_url, exported):
    """The client's schema failing its grammar (``grammar_failed``, a 400) is no failure of the
    worker: its span holds the why as an event, its status unset, in prefill (at its first token)
    and in decode (mid-reply); both were ERROR, among the operator's real failures."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store = Lifecycle.connect(redis_url)
    first = SamplingParams(max_tokens=8, grammar=Grammar(json_grammar(FAILING_LATE[0])))
    late = SamplingParams(max_tokens=400, temperature=1.0, seed=3, grammar=Grammar(json_grammar(LATE_PATTERN)))
    sent: list[DecodeJob] = []
    prefill = Runtime.load(settings, "prefill-schema@test", "prefill", False)
    run_jobs(PrefillLoop(prefill, recording(sent)), _admitted(store, "schema", [first, late]))
    run_jobs(DecodeLoop(Runtime.load(settings, "decode-schema@test", "decode", False)), sent)
    assert store.done("schema-0") == store.done("schema-1") == "error"
    spans = [s for s in exported.get_finished_spans() if s.name in ("prefill.forward", "decode.generate")]
    failed = {(s.name, s.attributes["dayzero.request_id"]) for s in spans if GRAMMAR_FAILED in _events(s)}
    assert failed == {("prefill.forward", "schema-0"), ("decode.generate", "schema-1")}, failed
    assert all(s.status.status_code.name == "UNSET" for s in spans), [(s.name, s.status) for s in spans]


def _events(span) -> list[str]:
    return [event.name for event in span.events]
