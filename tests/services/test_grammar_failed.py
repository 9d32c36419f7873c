"""A request whose grammar fails mid-reply by itself (past a limit of llguidance, with a schema the
gateway's checks let through) ends as the schema's failure: its stream's last entry names
llguidance's why under the code ``grammar_failed``, and the gateway answers it as a 400 (a stream:
an error event, then [DONE]), not a bare 500 "sampling failed: GrammarFailed". The loops run
in-process on a real Redis and a real runtime; the gateway in-process, ending a request as a
worker does."""

from __future__ import annotations

import json
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from dayzero.chat.grammar import json_grammar
from dayzero.params import Grammar, SamplingParams
from dayzero.serving.decode_loop import DecodeLoop
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import DecodeJob, GenerationRequest, PrefillJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings
from services.gateway.app import make_app

from ..grammar_cases import AB_PATTERN, FAILING_LATE, LATE_PATTERN, few_lexer_states, fill_lexer, late
from .conftest import MODEL, prompt_ids, recording, run_jobs, wait_until

WHY = "its grammar failed mid-reply: lexer error: too many expressions constructed"


def _last(store: Lifecycle, rid: str) -> dict[bytes, bytes]:
    (_, last), *_ = store.r.xrevrange(f"dz:tokens:{rid}", count=1)
    return last


def _prefilled(
    settings: Settings, store: Lifecycle, rid: str, sampling: SamplingParams, prompt: int
) -> list[DecodeJob]:
    """Request ``rid`` admitted and prefilled (its first token streamed): the decode job prefill sent."""
    request = GenerationRequest(
        request_id=rid, prompt_ids=tuple(prompt_ids(prompt)), sampling=sampling, created=time.time()
    )
    store.admit(request, [], "", 60)
    sent: list[DecodeJob] = []
    prefill = Runtime.load(settings, f"prefill-{rid}@test", "prefill", False)
    run_jobs(PrefillLoop(prefill, recording(sent)), [PrefillJob(request=request)])
    return sent


@pytest.mark.parametrize("leaves", [False, True])
def test_a_grammar_failing_mid_reply_ends_its_stream_with_its_why(demo_dir, redis_url, caplog, leaves):
    """... as the client's error: counted as a grammar failure, not decode's, and logged at INFO (a
    client sending such schemas at will inflated the decode failures and the ERROR log). Its client
    leaving as the failing step's append goes out (``leaves``: the cancel mark read with it ends the
    request), the failure was neither logged nor counted: it is, as it fails."""
    caplog.set_level(logging.INFO, logger="dayzero.decode")
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store, rid = Lifecycle.connect(redis_url), f"late-{leaves}"
    sampling = SamplingParams(max_tokens=400, temperature=1.0, seed=3, grammar=Grammar(json_grammar(LATE_PATTERN)))
    sent = _prefilled(settings, store, rid, sampling, 0)
    decode = Runtime.load(settings, f"decode7-{leaves}@test", "decode", False)
    loop, append = DecodeLoop(decode), decode.store.append

    def leaving(tokens, *args):
        if any(active.end is not None for active in loop.active.values()):
            store.cancel(rid)
        return append(tokens, *args)

    if leaves:
        decode.store.append = leaving
    run_jobs(loop, sent)
    last = _last(store, rid)
    if leaves:
        assert store.done(rid) == "cancelled", last
    else:
        assert store.done(rid) == "error", last
        assert (last[b"e"].decode(), last[b"c"]) == (WHY, b"grammar_failed")
        streamed = len(store.streamed_tokens(rid))
        assert streamed > 8
        assert int(last[b"i"]) == streamed, last  # next to its last token (one further: the token it failed on counted)
    snapshot = decode.stats.snapshot()
    assert (snapshot["counters"].get("grammar_failures"), snapshot["failures"].get("decode", 0)) == (1, 0), snapshot
    failed = [r for r in caplog.records if rid in r.getMessage()]
    assert failed and all(r.levelno == logging.INFO for r in failed), [(r.levelname, r.getMessage()) for r in failed]
    assert [r for r in failed if WHY in r.getMessage()], [r.getMessage() for r in failed]


def test_a_grammar_failing_at_its_first_token_ends_in_prefill(demo_dir, redis_url, caplog):
    """Its first token (prefill's, '{') leaves a required property that is its own object: the grammar
    fails there, before decode. Prefill counts it as the client's, as decode does: a grammar failure,
    logged at INFO (it was prefill's failure, logged at ERROR with a stack)."""
    caplog.set_level(logging.INFO, logger="dayzero.prefill")
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store = Lifecycle.connect(redis_url)
    sampling = SamplingParams(max_tokens=8, grammar=Grammar(json_grammar(FAILING_LATE[0])))
    request = GenerationRequest(
        request_id="first-1", prompt_ids=tuple(prompt_ids(1)), sampling=sampling, created=time.time()
    )
    store.admit(request, [], "", 60)
    sent: list[DecodeJob] = []
    prefill = Runtime.load(settings, "prefill8@test", "prefill", False)
    run_jobs(PrefillLoop(prefill, recording(sent)), [PrefillJob(request=request)])
    last = _last(store, "first-1")
    assert (store.done("first-1"), last[b"c"], sent) == ("error", b"grammar_failed", []), last
    assert last[b"e"].decode().startswith("its grammar failed mid-reply: ") and not store.streamed_tokens("first-1")
    snapshot = prefill.stats.snapshot()
    assert (snapshot["counters"].get("grammar_failures"), snapshot["failures"].get("prefill", 0)) == (1, 0), snapshot
    failed = [r for r in caplog.records if "first-1" in r.getMessage()]
    assert failed and all(r.levelno == logging.INFO and not r.exc_info for r in failed), [
        (r.levelname, r.getMessage()) for r in failed
    ]


def test_a_lexer_filled_as_decode_replays_the_first_token_carries_on_on_a_fresh_compile(
    demo_dir, redis_url, caplog, monkeypatch
):
    """Decode rebuilds a request's grammar state from prefill's first token; its compile's lexer full
    there (other replies filled it: llguidance's states at its limit), the request ended
    ``grammar_failed``, a 400 blamed on a fine schema. Now its row waits for a fresh compile (off the
    loop) and carries on: the reply its schema allows, no grammar failure counted, nothing at ERROR."""
    caplog.set_level(logging.INFO, logger="dayzero.decode")
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store = Lifecycle.connect(redis_url)
    lark = json_grammar(AB_PATTERN)
    sampling = SamplingParams(max_tokens=8, temperature=1.0, seed=0, grammar=Grammar(lark))
    sent = _prefilled(settings, store, "replay-1", sampling, 2)
    few_lexer_states(monkeypatch, 3_000)  # (decode's compile: full sooner)
    decode = Runtime.load(settings, "decode9@test", "decode", False)
    grammars, retired = decode.codec.grammars, []
    retire = grammars.retire
    monkeypatch.setattr(grammars, "retire", lambda lark, compiled: retired.append(compiled) or retire(lark, compiled))
    fill_lexer(grammars, lark)
    run_jobs(DecodeLoop(decode), sent)
    assert len(retired) == 1, "the replay met no full lexer"
    text = decode.codec.decode_all(store.streamed_tokens("replay-1"))
    assert (store.done("replay-1"), len(store.streamed_tokens("replay-1"))) == ("length", 8), text
    assert re.fullmatch(r'"[ab]*', text), text
    assert decode.stats.snapshot()["counters"].get("grammar_failures") == 0
    logged = [r for r in caplog.records if "replay-1" in r.getMessage()]
    assert all(r.levelno == logging.INFO for r in logged), [(r.levelname, r.getMessage()) for r in logged]


def test_a_replay_its_grammar_refuses_at_admission_counts_as_decodes_failure(demo_dir, redis_url, caplog):
    """A streamed token its grammar refuses (the server's fault: it allowed no such token) fails the
    request at decode's admission as it fails a step: logged at ERROR and counted as decode's failure
    (admission logged it and counted nothing: ``dayzero_operator_failures_total`` missed it)."""
    caplog.set_level(logging.INFO, logger="dayzero.decode")
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store = Lifecycle.connect(redis_url)
    sampling = SamplingParams(max_tokens=8, grammar=Grammar(json_grammar(AB_PATTERN)))
    (job,) = _prefilled(settings, store, "refused-1", sampling, 3)
    decode = Runtime.load(settings, "decode10@test", "decode", False)
    refused = decode.codec.grammars.tokenizer.tokenize_str("x")  # (the reply opens with '"')
    run_jobs(DecodeLoop(decode), [job.model_copy(update={"generated": tuple(refused)})])
    last = _last(store, "refused-1")
    assert (store.done("refused-1"), last.get(b"c", b"")) == ("error", b""), last
    assert last[b"e"].decode().startswith("the grammar refused the token sampled"), last
    snapshot = decode.stats.snapshot()
    assert (snapshot["counters"].get("grammar_failures"), snapshot["failures"].get("decode")) == (0, 1), snapshot
    failed = [r for r in caplog.records if "refused-1" in r.getMessage()]
    assert failed and all(r.levelno == logging.ERROR for r in failed), [(r.levelname, r.getMessage()) for r in failed]


@pytest.fixture(scope="module")
def gateway(demo_dir, redis_url):
    with TestClient(make_app(Settings(checkpoint=demo_dir, redis_url=redis_url))) as client:
        yield client, Lifecycle.connect(redis_url, 60)


def _fail(store: Lifecycle, rid: str) -> None:
    assert store.settle(rid, 0, "", "error", end_at=0, message=WHY, code="grammar_failed")  # as decode ends it


def test_the_gateway_answers_it_as_the_schemas_400(gateway):
    client, store = gateway
    running = set(store.active())
    body = {"model": MODEL, "prompt": [0, 5], "max_tokens": 3}
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(client.post, "/v1/completions", json=body)
        assert wait_until(lambda: len(set(store.active()) - running) == 1, 10.0)
        _fail(store, (set(store.active()) - running).pop())
        r = answer.result(timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == {
        "message": f"cannot enforce this schema: {WHY}",
        "type": "invalid_request_error",
        "param": None,
        "code": "grammar_failed",
    }


def test_a_stream_ends_with_its_error_event_then_done(gateway):
    client, store = gateway
    body = {"model": MODEL, "prompt": [0, 5], "max_tokens": 3, "stream": True}
    with client.stream("POST", "/v1/completions", json=body) as r:
        _fail(store, r.headers["x-request-id"])
        data = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data:")]
    assert json.loads(data[0])["error"]["code"] == "grammar_failed" and data[-1] == "[DONE]"
    assert json.loads(data[0])["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("path, field", [("/v1/completions", "response_format"), ("/v1/chat/completions", "tools")])
def test_the_400_names_the_field_whose_schema_failed(gateway, path, field):
    """(``param`` was null: the client had to guess which of its schemas; ended here as decode ends it.)"""
    client, store = gateway
    running = set(store.active())
    if field == "tools":
        tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        body = {"messages": [{"role": "user", "content": "Hi"}], "tools": [tool], "tool_choice": "required"}
    else:
        body = {
            "prompt": [0, 5],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
        }
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(client.post, path, json={"model": MODEL, "max_tokens": 3, **body})
        assert wait_until(lambda: len(set(store.active()) - running) == 1, 30.0), answer.result(timeout=30).text
        _fail(store, (set(store.active()) - running).pop())
        r = answer.result(timeout=30)
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == (field, "grammar_failed"), r.text


def test_one_failing_twelve_properties_in_is_refused_at_admission(gateway):
    """~170 bytes in: past the 64 bytes the check walked, it failed here mid-reply (a 400 after a 200
    stream began); the check walks 256 now. (A required property whose $ref is an object requiring
    itself: the nested count ``^((a{1000}){1000}){100}$`` this was, the size check refuses now.)"""
    client, _ = gateway
    node = {"$ref": "#/$defs/node"}
    schema = {
        **late(node, flags=12),
        "$defs": {"node": {"type": "object", "properties": {"c": node}, "required": ["c"]}},
    }
    format_ = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": [0, 5], "response_format": format_})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "response_format" and "error" in message and "too big" not in message, r.text
