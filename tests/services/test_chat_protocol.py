"""DeepSeek-V4's chat protocol through the real stack: the prompts it renders (/tokenize), JSON
replies enforced by constrained decoding on the random demo checkpoint, a streamed reasoning response
through the official ``openai`` client, and thought marks kept out of answers (tool calls:
test_chat_tool_calls.py)."""

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
    U,
    ask,
    many,
    openai_client,
    post,
    raw_continuation,
    valid_person,
)
from .conftest import MODEL, sse_events


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
