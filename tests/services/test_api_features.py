"""OpenAI API features through the whole pipeline: penalties, logprobs, echo, several choices."""

from __future__ import annotations

import httpx
import redis
import torch

from dayzero.checkpoint import load_model
from dayzero.kv.pools import pools_for
from dayzero.sampling import SamplingParams
from dayzero.tokenizer import TextCodec

from .conftest import MODEL, USAGE, chat, prompt_ids, sse_events, stream_text, wait_until
from .in_process import engine_steps


def test_penalties_reach_the_sampler(stack, reference):
    ids, penalties = prompt_ids(2), {"presence_penalty": 1.5, "frequency_penalty": 0.7}
    body = {"model": MODEL, "prompt": ids, "max_tokens": 16, "temperature": 0, "ignore_eos": True, **penalties}
    r = httpx.post(f"{stack.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == reference(ids, 16, **penalties)


def test_logprobs_in_bodies_and_streams_match_the_engine(stack, demo_dir):
    ids = prompt_ids(3)
    steps = engine_steps(demo_dir, ids, SamplingParams(max_tokens=10, ignore_eos=True, logprobs=2))
    body = {"model": MODEL, "prompt": ids, "max_tokens": 10, "temperature": 0, "ignore_eos": True, "logprobs": 2}
    served = httpx.post(f"{stack.url}/v1/completions", json=body, timeout=60).json()["choices"][0]["logprobs"]
    assert len(served["token_logprobs"]) == 10 and len(served["top_logprobs"]) == 10
    assert max(abs(a - s.logprob) for a, s in zip(served["token_logprobs"], steps, strict=True)) < 1e-4
    assert all(len(top) <= 2 for top in served["top_logprobs"])
    assert served["text_offset"][0] == 0 and served["text_offset"] == sorted(served["text_offset"])

    chat_body = chat("The quick brown fox", max_tokens=10, ignore_eos=True, logprobs=True, top_logprobs=2)
    streamed = []
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json={**chat_body, "stream": True}) as r:
        for _, data in sse_events(r):
            if data != "[DONE]":
                streamed += (data["choices"][0].get("logprobs") or {"content": []})["content"]
    whole = httpx.post(f"{stack.url}/v1/chat/completions", json=chat_body, timeout=60).json()
    content = whole["choices"][0]["logprobs"]["content"]
    assert len(content) == whole["usage"]["completion_tokens"] == len(streamed) == 10
    assert [e["logprob"] for e in streamed] == [e["logprob"] for e in content]  # same greedy run, same numbers
    assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in content)

    parts = {170: [0xE4], 126: [0xB8], 265: [0xAD]}  # the demo vocabulary's tokens of 中's UTF-8 bytes
    forced = chat("x", max_tokens=4, ignore_eos=True, logprobs=True, logit_bias=dict.fromkeys(parts, 100))
    content = httpx.post(f"{stack.url}/v1/chat/completions", json=forced, timeout=60).json()["choices"][0]
    assert [(e["token"], e["bytes"] in parts.values()) for e in content["logprobs"]["content"]] == [
        ("\ufffd", True)
    ] * 4


def test_a_character_cut_short_at_the_end_is_u_fffd_in_bodies_and_streams(stack, demo_dir):
    """Forced onto 中's lead byte (token 170, 0xE4), max_tokens ends the text inside a character:
    its text, whole and streamed, is transformers' decode of the ids (Python's bytes.decode with
    errors="replace"); the last byte was dropped ("" for max_tokens 1). A stop string matches it."""
    from transformers import AutoTokenizer

    decoded = AutoTokenizer.from_pretrained(str(demo_dir)).decode([170] * 3, skip_special_tokens=True)
    assert decoded == b"\xe4\xe4\xe4".decode(errors="replace") == "\ufffd" * 3
    forced = {"model": MODEL, "prompt": prompt_ids(5), "logit_bias": {"170": 100}, "ignore_eos": True}
    for max_tokens, stop, text, finish in (
        (1, None, "\ufffd", "length"),
        (3, None, decoded, "length"),
        (3, ["\ufffd" * 3], "", "stop"),
    ):
        body = {**forced, "max_tokens": max_tokens, "stop": stop}
        whole = httpx.post(f"{stack.url}/v1/completions", json=body, timeout=60).json()["choices"][0]
        streamed, _, final, _ = stream_text(f"{stack.url}/v1/completions", body)
        assert (
            (whole["text"], whole["finish_reason"])
            == (streamed, final["choices"][0]["finish_reason"])
            == (text, finish)
        )


def test_echo_returns_the_prompt_and_its_logprobs(stack, demo_dir):
    from dayzero.model.forward import score

    model, codec = load_model(demo_dir, progress=False), TextCodec.from_checkpoint(demo_dir)
    ids = prompt_ids(4)
    body = {"model": MODEL, "prompt": ids, "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1}
    choice = httpx.post(f"{stack.url}/v1/completions", json=body, timeout=60).json()["choices"][0]
    logprobs = choice["logprobs"]
    assert choice["text"].startswith(codec.decode(ids))
    assert len(logprobs["tokens"]) == len(ids) + 1 and logprobs["token_logprobs"][0] is None
    full = torch.log_softmax(score(model, pools_for(model.cfg, torch.float32, len(ids)), "s", ids), dim=-1)
    want = [full[t, ids[t + 1]].item() for t in range(len(ids) - 1)]  # the full forward, independently
    assert max(abs(a - b) for a, b in zip(logprobs["token_logprobs"][1 : len(ids)], want, strict=True)) < 1e-4
    assert logprobs["top_logprobs"][0] is None and all(len(t) == 1 for t in logprobs["top_logprobs"][1:])
    assert logprobs["tokens"][0] == "<｜begin▁of▁sentence｜>" and logprobs["text_offset"][:2] == [0, 0]  # BOS: no text

    plain = {**body, "logprobs": None, "stream": True}
    text, _, _, _ = stream_text(f"{stack.url}/v1/completions", plain)
    assert text.startswith(codec.decode(ids)) and len(text) > len(codec.decode(ids)) - 1


def test_several_prompts_and_n_give_one_choice_each_in_order(stack, reference):
    prompts = [prompt_ids(5), prompt_ids(6)]
    body = {"model": MODEL, "prompt": prompts, "n": 2, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    r = httpx.post(f"{stack.url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in out["choices"]] == [reference(p, 6) for p in prompts for _ in range(2)]
    assert out["usage"]["prompt_tokens"] == sum(map(len, prompts)) and out["usage"]["completion_tokens"] == 24
    assert len(r.headers["x-request-id"].split(",")) == 4
    assert out["id"] == "cmpl-" + r.headers["x-request-id"].split(",")[0]  # the first choice's request

    sampled = chat("tell me", max_tokens=8, ignore_eos=True, n=3, temperature=1.0, seed=7)
    choices = httpx.post(f"{stack.url}/v1/chat/completions", json=sampled, timeout=120).json()["choices"]
    assert len({c["message"]["content"] for c in choices}) > 1  # seeds 7, 8, 9: different draws


def test_several_choices_stream_together_and_leaving_cancels_them_all(stack, reference):
    prompts = [prompt_ids(7), prompt_ids(8)]
    body = {"model": MODEL, "prompt": prompts, "n": 2, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    texts, finished = {}, set()
    with httpx.stream("POST", f"{stack.url}/v1/completions", json={**body, **USAGE, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        events = list(sse_events(r))
    assert events[-1][1] == "[DONE]" and all(event_id is None for event_id, _ in events)
    assert len({data["id"] for _, data in events[:-1]}) == 1  # one response: one id, as in its body
    assert events[-2][1]["choices"] == []  # one usage chunk for them all; a prompt counts once
    assert all(data["usage"] is None for _, data in events[:-2])
    assert events[-2][1]["usage"] == {"prompt_tokens": 27 + 30, "completion_tokens": 4 * 6, "total_tokens": 81}
    for _, data in events[:-2]:
        choice = data["choices"][0]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
        if choice["finish_reason"]:
            finished.add(choice["index"])
    assert finished == {0, 1, 2, 3}
    assert [texts[i] for i in range(4)] == [reference(p, 6) for p in prompts for _ in range(2)]

    r = redis.Redis.from_url(stack.redis_url)
    long = chat("go on", max_tokens=2000, ignore_eos=True, n=3, stream=True)
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json=long, timeout=60) as response:
        ids = response.headers["x-request-id"].split(",")
        for seen, _ in enumerate(sse_events(response)):
            if seen >= 6:
                break  # the client leaves
    assert len(ids) == 3
    assert wait_until(lambda: all(r.get(f"dz:done:{rid}") == b"cancelled" for rid in ids), 5.0)


def test_each_prompt_of_a_list_counts_in_usage_equal_ones_too(stack):
    """OpenAI bills a completions list as its prompts sent one by one: two equal prompts are two
    prompts (only the ``n`` choices of one prompt share its count), in bodies and usage chunks."""
    ids = prompt_ids(3)
    body = {"model": MODEL, "prompt": [ids, ids], "n": 2, "max_tokens": 2, "temperature": 0, "ignore_eos": True}
    expected = {"prompt_tokens": 2 * len(ids), "completion_tokens": 8, "total_tokens": 2 * len(ids) + 8}
    r = httpx.post(f"{stack.url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200 and r.json()["usage"] == expected, r.text
    with httpx.stream("POST", f"{stack.url}/v1/completions", json={**body, **USAGE, "stream": True}, timeout=120) as s:
        events = list(sse_events(s))
    assert events[-2][1]["choices"] == [] and events[-2][1]["usage"] == expected


def test_text_offsets_index_the_text_past_characters_of_several_tokens(stack):
    """A character whose UTF-8 spans tokens ("é" is two byte tokens) takes one place in the text:
    each token's text_offset is where its text starts (the character's, for its bytes), streamed
    or not; they drifted by one per such token, pointing past the text (as loglikelihood
    evaluations read them: echo + logprobs). A stream resumed midway goes on from its offsets (it
    began again at 0)."""
    body = {"model": MODEL, "prompt": "Café au lait, naïve", "max_tokens": 4, "temperature": 0, "echo": True}
    body |= {"logprobs": 0, "ignore_eos": True}
    whole = httpx.post(f"{stack.url}/v1/completions", json=body, timeout=120).json()
    with httpx.stream("POST", f"{stack.url}/v1/completions", json={**body, "stream": True}, timeout=120) as r:
        rid, token = r.headers["x-request-id"], r.headers["x-resume-token"]
        events = [(i, data["choices"][0]) for i, data in sse_events(r) if data != "[DONE]"]
    chunks = [chunk for _, chunk in events]
    streamed = [o for chunk in chunks for o in chunk["logprobs"]["text_offset"]]
    cut = len(chunks) // 2
    resume = {"Last-Event-ID": events[cut - 1][0], "X-Resume-Token": token}
    with httpx.stream("GET", f"{stack.url}/v1/requests/{rid}/stream", headers=resume, timeout=120) as r:
        rest = [data["choices"][0]["logprobs"]["text_offset"] for _, data in sse_events(r) if data != "[DONE]"]
    assert 0 < cut < len(chunks) and [o for offsets in rest for o in offsets] == streamed[-sum(map(len, rest)) :]
    assert sum(map(len, rest)) == sum(len(chunk["logprobs"]["text_offset"]) for chunk in chunks[cut:])
    text, lp = whole["choices"][0]["text"], whole["choices"][0]["logprobs"]
    assert "".join(chunk["text"] for chunk in chunks) == text and streamed == lp["text_offset"]
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][-1] <= len(text)
    prompt = whole["usage"]["prompt_tokens"]  # the echoed prompt's tokens: their text is known
    pieces = [t for t in lp["tokens"][:prompt] if t.startswith("bytes:")]  # named by their bytes (OpenAI's way)
    assert len(pieces) == 4  # the checkpoint's tokenizer splits "é" and "ï"
    for token, at in zip(lp["tokens"][1:prompt], lp["text_offset"][1:prompt], strict=True):  # after BOS
        assert text[at:].startswith(token) or token in pieces and text[at] in "éï", (token, at, text)


def test_stop_strings_end_the_reply_not_the_markup_of_its_calls(stack):
    """V4 opens its calls with a blank line: stop strings such as "\\n" (common in clients) matched
    it, and cut every call away under tool_choice "required" ("stop", no call). They end the
    reply's text only, streamed or not."""
    weather = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": weather}}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    body = chat("Weather in Paris?", tools=tools, tool_choice=named, max_tokens=200, stop=["\n\n", "\n"])
    choice = httpx.post(f"{stack.url}/v1/chat/completions", json=body, timeout=120).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    (call,) = choice["message"]["tool_calls"]
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json={**body, "stream": True}, timeout=120) as r:
        chunks = [data["choices"][0] for _, data in sse_events(r) if data != "[DONE]"]
    deltas = [d for chunk in chunks for d in chunk["delta"].get("tool_calls", [])]
    assert deltas[0]["id"].startswith("call_") and deltas[0]["function"]["name"] == "get_weather"
    assert "".join(d["function"].get("arguments", "") for d in deltas) == call["function"]["arguments"]
    assert chunks[-1]["finish_reason"] == "tool_calls"


def test_any_int64_seed_openai_takes_is_taken_and_reproduces(stack):
    """OpenAI's seed is any 64-bit integer (vLLM's too); negative or past 2**44 it was a 400. It
    draws as seed mod (2**44 + 1), the sampler's range."""

    def text(seed: int) -> str:
        body = {"model": MODEL, "prompt": prompt_ids(4), "max_tokens": 6, "temperature": 1.0, "seed": seed}
        r = httpx.post(f"{stack.url}/v1/completions", json={**body, "ignore_eos": True}, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    for seed in (-1, 2**63 - 1, -(2**63)):
        assert text(seed) == text(seed) == text(seed % (2**44 + 1))


def test_bodies_carry_the_fields_openai_lists_as_null(stack):
    """OpenAI's schema requires a non-streamed choice's ``logprobs`` and a chat message's ``refusal``
    (nullable): they were left out unless logprobs were asked for."""
    r = httpx.post(f"{stack.url}/v1/chat/completions", json=chat("null fields", max_tokens=2), timeout=60)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["logprobs"] is None and choice["message"]["refusal"] is None, choice
    body = {"model": MODEL, "prompt": "null fields", "max_tokens": 2}
    r = httpx.post(f"{stack.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["logprobs"] is None, r.json()


def test_a_top_p_of_0_samples_the_greedy_completion(stack, reference):
    """OpenAI takes top_p 0 (it was a 400: at least 1e-3, as vLLM's): the most likely token alone,
    so any temperature and seed give the greedy completion (the engine's, run in-process)."""
    ids = prompt_ids(5)
    for sampling in ({"temperature": 1.5, "seed": 3}, {"temperature": 2.0}):
        body = {"model": MODEL, "prompt": ids, "max_tokens": 8, "ignore_eos": True, "top_p": 0, **sampling}
        r = httpx.post(f"{stack.url}/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == reference(ids, 8)
