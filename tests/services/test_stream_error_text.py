"""A request whose own sampling fails mid-reply (its grammar: a 400 ``grammar_failed``, after a 200
stream began) ends with the text its tokens held back (a character cut short: U+FFFD), and a
stream's client reads it before the error event: the text it read is the decode of the tokens
streamed, as at every other end a client reads. (A cancel ends with none: a request is cancelled
once its readers have left.) The loops run in-process on a real Redis, the gateway in-process."""

from __future__ import annotations

import json
import time

import pytest
import redis
from fastapi.testclient import TestClient
from transformers import PreTrainedTokenizerFast

from dayzero import speculative
from dayzero.completion import Completion
from dayzero.guided import GrammarFailed
from dayzero.params import SamplingParams
from dayzero.serving import decode_loop
from dayzero.serving.decode_loop import DecodeLoop
from dayzero.serving.keys import key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import GenerationRequest, PrefillJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.records import Token, decode
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings
from services.gateway.app import make_app

from .conftest import MODEL, recording, run_jobs

WHY = "lexer error: too many expressions constructed"  # (llguidance's, as it fails by itself)


def _prefilled_onto_a_lead_byte(demo_dir, redis_url, rid: str, k: int = 0) -> tuple[Lifecycle, Runtime, list]:
    """Request ``rid`` forced onto 中's lead byte (token 170, 0xE4) and prefilled (its first token
    streamed): its store, a decode runtime (speculating ``k`` tokens), and its decode jobs."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis", speculative_tokens=k)
    sampling = SamplingParams(max_tokens=50, ignore_eos=True, logit_bias=((170, 100.0),))
    request = GenerationRequest(request_id=rid, prompt_ids=(0, 5, 6), sampling=sampling, created=time.time())
    store, sent = Lifecycle.connect(settings.redis_url), []
    store.admit(request, [], "", 60)
    run_jobs(
        PrefillLoop(Runtime.load(settings, f"prefill-{rid}@test", "prefill", False), recording(sent)),
        [PrefillJob(request=request)],
    )
    return store, Runtime.load(settings, f"decode-{rid}@test", "decode", False), sent


def _streamed(store: Lifecycle, rid: str) -> tuple[list[int], str, Token]:
    """The ids on ``rid``'s stream, its texts joined, and its last entry."""
    entries = [decode(rid, fields) for _, fields in store.r.xrange(key("tokens", rid))]
    return [t.token for t in entries if t.token >= 0], "".join(t.text for t in entries), entries[-1]


def test_a_grammar_failing_after_a_lead_byte_ends_with_its_u_fffd(demo_dir, redis_url, monkeypatch):
    """Forced onto 中's lead byte (token 170, 0xE4), its grammar failing at the third token: two
    streamed, the second held (a character cut short). Its error ending dropped it: the stream's
    texts joined to "\\ufffd" where the two tokens decode to "\\ufffd\\ufffd"."""
    store, runtime, sent = _prefilled_onto_a_lead_byte(demo_dir, redis_url, "cut")
    emit = Completion.emit

    def failing(completion: Completion, token, logits):
        if completion.count >= 2:
            raise GrammarFailed(WHY)
        return emit(completion, token, logits)

    monkeypatch.setattr(Completion, "emit", failing)
    run_jobs(DecodeLoop(runtime), sent)
    ids, text, last = _streamed(store, "cut")
    assert ids == [170, 170] and (store.done("cut"), last.code) == ("error", "grammar_failed")
    assert text == runtime.codec.decode(ids) == "\ufffd\ufffd"
    runtime.close()


def test_a_failed_decode_step_ends_with_the_u_fffd_its_tokens_held(demo_dir, redis_url, monkeypatch):
    """Forced onto 中's lead byte, the batch's second decode step failing (every active request ends
    "error": ``DecodeLoop._fail``): two tokens streamed, the second held (a character cut short).
    Its error ending dropped it: the texts joined to "\\ufffd" where the two tokens decode to
    "\\ufffd\\ufffd", as a request's own sampling failure now ends."""
    store, runtime, sent = _prefilled_onto_a_lead_byte(demo_dir, redis_url, "step")
    decode_step, steps = runtime.ranks.decode, []

    def failing(ids, tokens):
        steps.append(ids)
        if len(steps) >= 2:
            raise RuntimeError("device lost")
        return decode_step(ids, tokens)

    monkeypatch.setattr(runtime.ranks, "decode", failing)
    run_jobs(DecodeLoop(runtime), sent)
    ids, text, last = _streamed(store, "step")
    assert ids == [170, 170] and (store.done("step"), last.error) == ("error", "decode failed: RuntimeError")
    assert text == runtime.codec.decode(ids) == "\ufffd\ufffd"
    runtime.close()


def test_a_stream_reads_the_failures_text_before_its_error_event(demo_dir, redis_url):
    """Ended as decode ends it after a held lead byte (text "\\ufffd"): the stream's chunks carry it,
    then the error event (the text was never sent)."""
    with TestClient(make_app(Settings(checkpoint=demo_dir, redis_url=redis_url))) as client:
        store = Lifecycle.connect(redis_url, 60)
        body = {"model": MODEL, "prompt": [0, 5], "max_tokens": 3, "stream": True}
        with client.stream("POST", "/v1/completions", json=body) as r:
            rid = r.headers["x-request-id"]
            assert store.settle(rid, 0, "", "error", end_at=0, message=WHY, code="grammar_failed", text="\ufffd")
            data = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data:")]
    assert [json.loads(d)["choices"][0]["text"] for d in data[:-2]] == ["\ufffd"]
    assert json.loads(data[-2])["error"]["code"] == "grammar_failed" and data[-1] == "[DONE]"


def test_a_chat_stream_reads_the_text_its_parser_held_before_the_error_event(demo_dir, redis_url):
    """A chat's content that ends in "<" (it may open ``<think>``: the stream's parser holds it) when
    its grammar fails: the client reads it before the error event, as a "length" end releases it."""
    with TestClient(make_app(Settings(checkpoint=demo_dir, redis_url=redis_url))) as client:
        store = Lifecycle.connect(redis_url, 60)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
        with client.stream("POST", "/v1/chat/completions", json=body) as r:
            rid = r.headers["x-request-id"]
            store.append([Token(rid, 0, 7, "a <")], {rid: 0}, "")
            assert store.settle(rid, 0, "", "error", end_at=1, message=WHY, code="grammar_failed")
            data = [json.loads(line.removeprefix("data: ")) for line in r.iter_lines() if line.startswith("data: {")]
    assert "".join(d["choices"][0]["delta"].get("content", "") for d in data[:-1]) == "a <"
    assert data[-1]["error"]["code"] == "grammar_failed"


@pytest.mark.parametrize(
    ("module", "name", "k"),
    [(decode_loop, "record_step", 0), (speculative, "follow", 2)],
    ids=["its_metrics_record", "a_speculative_rounds_mtp_catch_up"],
)
def test_a_step_failing_after_its_sampling_ends_where_its_stream_does(
    demo_dir, redis_url, monkeypatch, module, name, k
):
    """The second decode step failing after its tokens were sampled (its metrics' record raising,
    or speculating, its round's MTP catch-up, before the loop queued them): the error ended the
    stream at the completion's count (index 3 after tokens 0-1, 7 after 0-3: tokens its client
    never read) with their held text. Now given up with the step: the end where the stream's
    tokens end, and its text what they held (the last lead byte's U+FFFD: the texts joined are
    transformers' decode of the ids; it was none, one U+FFFD short)."""
    store, runtime, sent = _prefilled_onto_a_lead_byte(demo_dir, redis_url, name, k)
    real, calls = getattr(module, name), []

    def failing(*args):
        calls.append(args)
        if len(calls) >= 2:
            raise RuntimeError("step failed")
        return real(*args)

    monkeypatch.setattr(module, name, failing)
    run_jobs(DecodeLoop(runtime), sent)
    ids, text, last = _streamed(store, name)
    assert (store.done(name), last.error, len(calls)) == ("error", "decode failed: RuntimeError", 2)
    assert len(ids) >= 2 and set(ids) == {170} and last.index == len(ids)
    assert text == _transformers(demo_dir).decode(ids) == "\ufffd" * len(ids)
    runtime.close()


@pytest.mark.parametrize("failing", ["append", "record_step"])
def test_a_failure_gives_up_the_text_of_the_tokens_past_the_stream(demo_dir, redis_url, monkeypatch, failing):
    """Tokens 170 170 streamed (their last lead byte held), then "a" sampled and given up: its append
    refused (Redis unavailable for a moment: it stays unsent) and the next one failing otherwise, or
    its step's metrics record failing before its append. The texts joined are what transformers
    decodes the streamed ids to, "\ufffd\ufffd": the text state where the stream ends is ended, not
    the completion's ("a" after the lead byte: its U+FFFD was a's never-streamed delta, the end "").
    Lead bytes alone were given up before, where the end reads the same either way."""
    store, runtime, sent = _prefilled_onto_a_lead_byte(demo_dir, redis_url, failing)
    emit, a, calls = Completion.emit, runtime.codec.encode("a", special=False), []
    monkeypatch.setattr(Completion, "emit", lambda c, token, logits: emit(c, a[0] if c.count >= 2 else token, logits))
    owner = runtime.store if failing == "append" else decode_loop
    real = getattr(owner, failing)

    def refusing(*args):
        calls.append(args)
        if len(calls) == 2 and failing == "append":
            raise redis.ConnectionError("Redis is loading the dataset in memory")
        if len(calls) == 2 + (failing == "append"):
            raise RuntimeError("failed")
        return real(*args)

    monkeypatch.setattr(owner, failing, refusing)
    run_jobs(DecodeLoop(runtime), sent)
    ids, text, last = _streamed(store, failing)
    assert (store.done(failing), last.error, ids) == ("error", "decode failed: RuntimeError", [170, 170])
    assert text == _transformers(demo_dir).decode(ids) == "\ufffd\ufffd"
    runtime.close()


def _transformers(demo_dir) -> PreTrainedTokenizerFast:
    """The demo checkpoint's tokenizer as transformers loads it (the reference decode)."""
    return PreTrainedTokenizerFast(tokenizer_file=str(demo_dir / "tokenizer.json"))
