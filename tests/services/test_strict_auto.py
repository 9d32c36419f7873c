"""``strict: true`` under tool_choice "auto" through the real stack (the random demo checkpoint,
nudged towards a call block), in chat and thinking mode (a block may end the thought): each
streamed reply is text, or calls whose strict tool's arguments follow its schema; the other tool's
calls come back as written."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from dayzero.chat.tokens import END_THINK

from .chat_requests import SEEDS, WEATHER, D, accumulate_calls, ask, post
from .conftest import MODEL, sse_events

STRICT_WEATHER = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
NOTE = {"type": "function", "function": {"name": "note", "parameters": {"type": "object"}}}


def _streamed(stack, body: dict) -> tuple[str, dict[int, dict], str | None]:
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json={**body, "stream": True}, timeout=300) as r:
        assert r.status_code == 200, r.read()
        chunks = [data for _, data in sse_events(r) if data != "[DONE]" and data["choices"]]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    return (content, *accumulate_calls(chunks))


def _valid_weather(args: dict) -> bool:
    return (
        {"city", "days"} <= set(args) <= {"city", "days", "unit"}
        and isinstance(args["city"], str)
        and len(args["city"]) <= 12
        and type(args["days"]) is int
        and 1 <= args["days"] <= 7
        and args.get("unit", "c") in ("c", "f")
    )


@pytest.mark.slow
@pytest.mark.parametrize("thinking", [False, True], ids=["chat", "thinking"])
def test_streamed_replies_under_auto_are_text_or_calls_that_follow_the_strict_schema(stack, thinking):
    opening = post(stack, "/tokenize", {"prompt": f"<{D}"}).json()["tokens"][-2:]  # "<", the marker
    ending = post(stack, "/tokenize", {"prompt": END_THINK}).json()["tokens"][-1:] if thinking else []
    # (a block in the thought ends it only after a blank line: the random model is nudged out of it first)
    sampling = {"temperature": 1.0, "logit_bias": {str(token): 4 for token in opening + ending}}
    mode = {"chat_template_kwargs": {"thinking": thinking}}
    bodies = [{"model": MODEL, **ask(tools=[STRICT_WEATHER, NOTE], seed=s, **sampling, **mode)} for s in SEEDS]
    with ThreadPoolExecutor(len(bodies)) as pool:  # (all in flight, decoded together)
        replies = list(pool.map(lambda b: _streamed(stack, b), bodies))
    checked = []  # the strict tool's calls written whole
    for content, calls, finish in replies:
        assert D not in content
        assert finish in ("stop", "length", "tool_calls") and (not calls or finish != "stop"), (content, calls, finish)
        whole = list(calls.values())[: None if finish == "tool_calls" else -1]  # (max_tokens may cut the last)
        for call in whole:
            args = json.loads(call["arguments"])
            assert call["name"] in ("get_weather", "note") and isinstance(args, dict), call
            assert call["name"] != "get_weather" or _valid_weather(args), call
            checked += [call] if call["name"] == "get_weather" else []
    # the nudge made calls, some to the strict tool written whole (max_tokens cuts most replies' last)
    assert checked, replies
