"""DeepSeek-V4's tool calls through the real stack: calls forced by constrained decoding on the random
demo checkpoint, the official ``openai`` client through a tool round trip, a call streamed, resumed
and cut by max_tokens, and DSML written where no call can be."""

from __future__ import annotations

import json

import httpx
import pytest

from .chat_requests import (
    SEEDS,
    WEATHER,
    A,
    D,
    E,
    U,
    accumulate_calls,
    ask,
    many,
    openai_client,
    post,
    raw_continuation,
)
from .conftest import MODEL, resumed_events, sse_events


def test_named_tool_calls_are_valid_for_20_seeds(stack):
    named = {"type": "function", "function": {"name": "get_weather"}}
    choices = many(stack, [ask(tools=[WEATHER], tool_choice=named, temperature=1.0, seed=s) for s in SEEDS])
    for choice in choices:
        assert choice["finish_reason"] == "tool_calls", choice
        message = choice["message"]
        assert message["content"] is None and len(message["tool_calls"]) == 1
        call = message["tool_calls"][0]
        assert call["type"] == "function" and call["id"].startswith("call_")
        args = json.loads(call["function"]["arguments"])
        assert call["function"]["name"] == "get_weather" and {"city", "days"} <= set(args) <= {"city", "days", "unit"}
        assert isinstance(args["city"], str) and len(args["city"]) <= 12 and "<" not in args["city"]
        assert type(args["days"]) is int and 1 <= args["days"] <= 7 and args.get("unit", "c") in ("c", "f")


def test_openai_client_tool_round_trip(stack):
    client = openai_client(stack)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    first = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER], tool_choice=named, temperature=1.0, seed=7, max_tokens=400
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    args = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and {"city", "days"} <= set(args)

    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "21 C"},
    ]
    ids = post(stack, "/tokenize", {"messages": messages, "tools": [WEATHER]}).json()["tokens"]
    prompt = post(stack, "/detokenize", {"tokens": ids}).json()["prompt"]
    params = [f'<{D}parameter name="city" string="true">{args["city"]}</{D}parameter>']
    params.append(f'<{D}parameter name="days" string="false">{args["days"]}</{D}parameter>')
    if "unit" in args:
        params.append(f'<{D}parameter name="unit" string="true">{args["unit"]}</{D}parameter>')
    block = (
        f'\n\n<{D}tool_calls>\n<{D}invoke name="get_weather">\n'
        + "\n".join(params)
        + f"\n</{D}invoke>\n</{D}tool_calls>"
    )
    assert prompt.endswith(f"{U}Weather in Paris?{A}</think>{block}{E}{U}<tool_result>21 C</tool_result>{A}</think>")

    no_dsml = {"9": -100}  # the random model must answer, not call again
    second = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER], temperature=0, max_tokens=12, logit_bias=no_dsml
    )
    answer = second.choices[0]
    assert answer.finish_reason in ("stop", "length") and not answer.message.tool_calls
    assert answer.message.content == raw_continuation(stack, messages, 12, tools=[WEATHER], logit_bias=no_dsml)[0]


def test_a_streamed_tool_call_resumed_midway_equals_the_body(stack):
    named = {"type": "function", "function": {"name": "get_weather"}}
    body = {"model": MODEL, **ask(tools=[WEATHER], tool_choice=named, temperature=1.0, seed=11)}
    (call,) = post(stack, "/v1/chat/completions", body).json()["choices"][0]["message"]["tool_calls"]
    seen, last = [], None
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json={**body, "stream": True}, timeout=300) as r:
        rid, token = r.headers["x-request-id"], r.headers["x-resume-token"]
        events = sse_events(r)  # held: a reader dropped at its break closes the connection (httpcore)
        for event_id, data in events:
            seen.append(data)
            if event_id and "tool_calls" in data["choices"][0]["delta"]:
                last = event_id  # the call's name has come: read no more here, before its arguments
                break
        # resumed while this read is still open (it left at the break before: a resume the load held past
        # the leave's 0.3 s grace found its request cancelled, CI at load ~5 and ~15)
        with httpx.stream(
            "GET",
            f"{stack.url}/v1/requests/{rid}/stream",
            headers={"Last-Event-ID": last, "X-Resume-Token": token},
            timeout=300,
        ) as resumed:
            assert resumed.status_code == 200
            rest = [data for _, data in sse_events(resumed) if data != "[DONE]"]
    assert accumulate_calls(seen)[0] == {0: {"name": "get_weather", "arguments": ""}}  # left inside the call
    calls, finish = accumulate_calls(seen + rest)
    assert finish == "tool_calls" and list(calls) == [0]
    assert calls[0] == {"name": "get_weather", "arguments": call["function"]["arguments"]}


def test_a_tool_call_cut_by_max_tokens_reads_the_same_streamed_and_in_the_body(stack):
    """Cut inside the call: a stream has given the call's id and name, so the body gives them too
    (no arguments, finish_reason "length"), as OpenAI's API does."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    body = {"model": MODEL, **ask(tools=[WEATHER], tool_choice=named, temperature=1.0, seed=11)}
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json={**body, "stream": True}, timeout=300) as r:
        named_at = next(
            int(event_id.split("-")[0])  # entry ids count the tokens: "{n}-0" after the n-th
            for event_id, data in sse_events(r)
            if event_id and "tool_calls" in data["choices"][0]["delta"]
        )
    cut = {**body, "max_tokens": named_at + 1}  # the name is out; the arguments cannot close in one token
    choice = post(stack, "/v1/chat/completions", cut).json()["choices"][0]
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json={**cut, "stream": True}, timeout=300) as r:
        streamed = [data for _, data in sse_events(r) if data != "[DONE]"]
    (call,) = choice["message"]["tool_calls"]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] is None
    assert call["function"] == {"name": "get_weather", "arguments": ""} and call["id"].startswith("call_")
    assert accumulate_calls(streamed) == ({0: {"name": "get_weather", "arguments": ""}}, "length")


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_call_cut_before_its_marker_leaves_no_content(stack, choice):
    """The answer can only be a call: cut in the blank line and "<" that open its block, before the
    DSML token, it came back as content ("\\n\\n<"), in the body and the stream; then in a stream
    resumed with Last-Event-ID only."""
    body = {**ask(tools=[WEATHER], tool_choice=choice, temperature=0), "logprobs": True}
    for max_tokens in (1, 2, 3):
        reply = post(stack, "/v1/chat/completions", {**body, "max_tokens": max_tokens}).json()["choices"][0]
        written = "".join(t["token"] for t in reply["logprobs"]["content"])
        assert f"\n\n<{D}".startswith(written) and reply["finish_reason"] == "length", reply
        assert reply["message"]["content"] == "" and "tool_calls" not in reply["message"], reply
        cut = {"model": MODEL, **body, "max_tokens": max_tokens, "stream": True}  # (it had none: a 400, no events)
        with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json=cut, timeout=300) as r:
            deltas = [data["choices"][0]["delta"] for _, data in sse_events(r) if data != "[DONE]"]
            read_again = resumed_events(stack.url, r.headers["x-request-id"], r.headers["x-resume-token"], "0-0")
        assert "".join(d.get("content", "") for d in deltas) == "", deltas
        deltas = [data["choices"][0]["delta"] for _, data in read_again]  # (it came back: read from the record)
        assert "".join(d.get("content", "") for d in deltas) == "", deltas


def test_dsml_without_tools_is_text_and_a_stray_dsml_token_with_tools_is_dropped(stack):
    """The random model made to write only DSML tokens: without tools offered its text comes back as
    written; with tools offered, tokens that open no call block are dropped, never content."""
    body = ask("Hi", max_tokens=3, temperature=0, logit_bias={"9": 100})  # 9: ｜DSML｜
    plain = post(stack, "/v1/chat/completions", body).json()["choices"][0]
    assert plain["message"] == {"role": "assistant", "content": D * 3, "refusal": None}, plain
    assert plain["finish_reason"] == "length"
    offered = post(stack, "/v1/chat/completions", {**body, "tools": [WEATHER]}).json()["choices"][0]
    assert offered["message"] == {"role": "assistant", "content": "", "refusal": None}, offered
    assert offered["finish_reason"] == "length"
