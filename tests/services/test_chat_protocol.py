"""DeepSeek-V4's chat protocol through the real stack: the prompts it renders (/tokenize), tool
calls and JSON replies enforced by constrained decoding on the random demo checkpoint, and the
official ``openai`` client through a tool round trip and a streamed reasoning response."""

from __future__ import annotations

import json

import httpx
import pytest

from .chat_requests import (
    PREFIX,
    SCHEMA,
    SEEDS,
    WEATHER,
    A,
    B,
    D,
    E,
    U,
    accumulate_calls,
    ask,
    many,
    openai_client,
    post,
    raw_continuation,
    valid_person,
)
from .conftest import MODEL, resumed_events, sse_events


def test_tokenize_renders_v4s_prompt_and_detokenize_keeps_special_tokens(stack):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    body = {"messages": chat, "chat_template_kwargs": {"thinking": True, "reasoning_effort": "low"}}
    tokens = post(stack, "/tokenize", body).json()
    text = post(stack, "/detokenize", {"tokens": tokens["tokens"]}).json()["prompt"]
    assert text == f"{B}Be brief.{U}Hi{A}<think>" and tokens["count"] == len(tokens["tokens"])
    assert tokens["tokens"][0] == 0 and tokens["tokens"][-2:] == [4, 5]  # V4's specials are single tokens
    plain = post(stack, "/tokenize", {"prompt": "Hello"}).json()
    assert post(stack, "/detokenize", {"tokens": plain["tokens"]}).json()["prompt"] == f"{B}Hello"


@pytest.mark.parametrize(
    "body, param",
    [
        (ask(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
        (ask(tool_choice="required"), "tool_choice"),
        (ask(tools=[{"type": "function", "function": {"name": "bad name!"}}]), "tools"),
        (
            ask(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}),
            None,
        ),
        (ask(chat_template_kwargs={"thinking": True, "enable_thinking": True}), "chat_template_kwargs"),
        (ask(reasoning_effort="extreme"), "reasoning_effort"),
        ({"prompt": "hi", "tools": [WEATHER]}, "tools"),
        ({"messages": [{"role": "user", "content": "hi", "prefix": True}]}, "messages"),
        (
            {"messages": [{"role": "assistant", "content": "x", "prefix": True}, {"role": "user", "content": "y"}]},
            "messages",
        ),
        (ask(tools=[WEATHER], tool_choice="required", messages=[*ask()["messages"], PREFIX]), None),
    ],
)
def test_bad_protocol_input_is_refused_with_400(stack, body, param):
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    r = post(stack, path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert param is None or error["param"].startswith(param), error
    both = post(stack, "/tokenize", {"prompt": "x", "messages": [{"role": "user", "content": "y"}]})
    assert both.status_code == 400 and "either" in both.json()["error"]["message"]


@pytest.mark.parametrize("thinking", [False, True])
def test_a_prefix_is_continued_like_the_same_prompt_sent_as_ids(stack, thinking):
    """DeepSeek's chat prefix completion: the prompt ends with the prefix (no EOS; in thinking mode
    after the reasoning's end), and the reply is what a plain completion of that prompt generates."""
    chat = [{"role": "user", "content": "Sort a list"}, {**PREFIX, "reasoning_content": "Use sorted."}]
    mode = {"chat_template_kwargs": {"thinking": thinking}}
    ids = post(stack, "/tokenize", {"messages": chat, **mode}).json()["tokens"]
    opened = "<think>Use sorted.</think>" if thinking else "</think>"
    assert post(stack, "/detokenize", {"tokens": ids}).json()["prompt"] == f"{B}{U}Sort a list{A}{opened}```python\n"
    greedy = {"max_tokens": 12, "temperature": 0}
    reply = post(stack, "/v1/chat/completions", {"messages": chat, **mode, **greedy}).json()["choices"][0]
    plain = post(stack, "/v1/completions", {"prompt": ids, **greedy}).json()["choices"][0]
    assert reply["message"]["content"] == plain["text"] and reply["finish_reason"] == plain["finish_reason"]
    assert reply["message"].get("reasoning_content") is None  # the answer was reached: all of it is content


def test_json_schema_replies_are_valid_for_20_seeds(stack):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    choices = many(stack, [ask("Who?", response_format=fmt, temperature=1.0, seed=s) for s in SEEDS])
    for choice in choices:
        assert choice["finish_reason"] == "stop", choice
        assert valid_person(json.loads(choice["message"]["content"])), choice


def test_thinking_mode_reasons_freely_then_replies_valid_json(stack):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    nudge = {"6": 3}  # the random model closes its thought within a few dozen tokens
    bodies = [
        ask("Who?", response_format=fmt, temperature=1.0, seed=s, logit_bias=nudge, reasoning_effort="high")
        for s in range(4)
    ]
    for choice in many(stack, bodies):
        message = choice["message"]
        assert choice["finish_reason"] == "stop" and isinstance(message["reasoning_content"], str), choice
        assert valid_person(json.loads(message["content"])), choice


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


def test_openai_client_streams_reasoning(stack):
    messages = [{"role": "user", "content": "Think first."}]
    thinking = {"chat_template_kwargs": {"thinking": True}}
    sampling = {"temperature": 1.0, "logit_bias": {"6": 3, "9": -100}}  # nudged to close its thought, no DSML
    for seed in range(40):  # a seed with which the random model closes its thought midway
        text, tokens = raw_continuation(stack, messages, 24, seed=seed, **sampling, **thinking)
        if text.find("</think>") > 0:
            break
    else:
        pytest.fail("no seed made the demo model close its thought")
    stream = openai_client(stack).chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=24,
        seed=seed,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=thinking,
        **sampling,
    )
    reasoning, content, usage = "", "", None
    for chunk in stream:
        assert usage is None, "the usage chunk comes last"
        if not chunk.choices:
            usage = chunk.usage
            continue
        delta = chunk.choices[0].delta
        reasoning += getattr(delta, "reasoning_content", None) or ""
        content += delta.content or ""
    want_reasoning, want_content = text.split("</think>", 1)
    assert (reasoning, content) == (want_reasoning, want_content) and reasoning and content
    assert 0 < usage.completion_tokens <= 24 and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    # the tokens up to the one that ends the thought, as OpenAI's (and DeepSeek's) usage reports them
    reasoning_tokens = tokens.index("</think>") + 1
    assert usage.completion_tokens_details.reasoning_tokens == reasoning_tokens
    body = {"messages": messages, "max_tokens": 24, "seed": seed, **sampling, **thinking}
    assert post(stack, "/v1/chat/completions", body).json()["usage"]["completion_tokens_details"] == {
        "reasoning_tokens": reasoning_tokens
    }


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


@pytest.mark.parametrize(("thinking", "mark"), [(False, "5"), (False, "6"), (True, "6")])  # 5: <think>, 6: </think>
def test_a_thought_mark_written_in_the_answer_is_dropped(stack, thinking, mark):
    """DeepSeek's decoder refuses a reply whose content holds ``<think>`` or ``</think>``: the random
    model made to write only one came back with content "<think><think><think>" in chat mode."""
    body = ask("Hi", max_tokens=3, temperature=0, logit_bias={mark: 100}, chat_template_kwargs={"thinking": thinking})
    whole = post(stack, "/v1/chat/completions", body).json()["choices"][0]
    assert whole["message"]["content"] == "" and whole["finish_reason"] == "length", whole
    streamed = {"model": MODEL, **body, "stream": True}
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json=streamed, timeout=300) as r:
        deltas = [data["choices"][0]["delta"] for _, data in sse_events(r) if data != "[DONE]"]
    assert deltas and "".join(d.get("content", "") for d in deltas) == "", deltas
