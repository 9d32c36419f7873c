"""What an admission does off the event loop, and only that: a grammar's check and compile (none
asked for: no hop to the thread pool), long prompt text's tokenizing (short text costs less than
the hop and back, on the loop; long text off it: the loop's other requests would wait)."""

from __future__ import annotations

import asyncio
import itertools
import threading
from types import SimpleNamespace

import anyio

from services.gateway import chat
from services.gateway.context import ENCODED_ON_THE_LOOP, encoded
from services.gateway.schemas import CompletionRequest


class _Codec:
    """Records the thread each encode ran on."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []

    def encode(self, text: str, limit: int | None = None, special: bool = True) -> list[int]:
        self.threads.append(threading.current_thread())
        return [len(text), limit or 0, int(special)]


def test_short_text_is_encoded_on_the_loop_and_long_text_off_it():
    codec = _Codec()
    gw = SimpleNamespace(codec=codec, tokenizing=anyio.CapacityLimiter(1))

    async def both() -> tuple[list[int], list[int], threading.Thread]:
        short = await encoded(gw, "x" * ENCODED_ON_THE_LOOP, 10)
        long = await encoded(gw, "x" * (ENCODED_ON_THE_LOOP + 1), None, False)
        return short, long, threading.current_thread()

    short, long, loop = asyncio.run(both())
    assert short == [ENCODED_ON_THE_LOOP, 10, 1] and long == [ENCODED_ON_THE_LOOP + 1, 0, 0]
    assert codec.threads[0] is loop and codec.threads[1] is not loop


def test_a_grammar_is_made_off_the_loop_and_only_when_the_body_asks_for_one(monkeypatch):
    threads = []

    def grammar(gw, body, thinking=False):
        threads.append(threading.current_thread())
        return "rule"

    monkeypatch.setattr(chat, "grammar", grammar)
    free = CompletionRequest(model="m", prompt="hi")
    text = CompletionRequest(model="m", prompt="hi", response_format={"type": "text"})
    json_reply = CompletionRequest(model="m", prompt="hi", response_format={"type": "json_object"})

    async def all_three() -> tuple[list, threading.Thread]:
        return [await chat.enforced(None, body) for body in (free, text, json_reply)], threading.current_thread()

    rules, loop = asyncio.run(all_three())
    assert rules == [None, None, "rule"]
    assert len(threads) == 1 and threads[0] is not loop


_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
_STRICT = {"type": "function", "function": {**_TOOL["function"], "strict": True}}
_CHOICES = [None, "none", "auto", "required", {"type": "function", "function": {"name": "f"}}]
_TOOLSETS = [None, [_TOOL], [_STRICT], [_TOOL, _STRICT]]
_FORMATS = [None, {"type": "text"}, {"type": "json_object"}]
_FORMATS += [{"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}]


def test_a_chat_body_takes_the_hop_exactly_when_the_real_grammar_enforces_something(demo_dir, redis_url):
    """``constrained`` (the hop's gate) against the real ``grammar``, for every tool_choice, tools
    (none, free, strict, both), response_format and parallel_tool_calls the schemas accept: a gate
    False where a grammar exists drops the grammar silently (the reply unenforced)."""
    from fastapi.testclient import TestClient
    from pydantic import ValidationError

    from dayzero.settings import Settings
    from services.gateway.app import make_app
    from services.gateway.chat_schemas import ChatCompletionRequest

    with TestClient(make_app(Settings(checkpoint=demo_dir, redis_url=redis_url))) as client:
        gw, seen = client.app.state.gateway, set()
        for choice, tools, fmt, parallel in itertools.product(_CHOICES, _TOOLSETS, _FORMATS, [None, False]):
            fields = {"tool_choice": choice, "tools": tools, "response_format": fmt, "parallel_tool_calls": parallel}
            try:
                body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **fields)
            except ValidationError:
                continue
            for thinking in (False, True):
                made = chat.grammar(gw, body, thinking) is not None
                assert chat.constrained(body) == made, (fields, thinking)
                seen.add(made)
    assert seen == {True, False}


def test_a_short_text_chat_is_rendered_on_the_loop_and_any_other_off_it(monkeypatch):
    """A chat of short text alone renders and tokenizes on the event loop, as a completion's short
    prompt does (it took the thread pool's hop and back for ~60 us of work), an assistant's refusal
    part as text; an image, long text, tools, a reply schema or a call in the history still go off
    the loop."""
    from services.gateway.chat_schemas import ChatCompletionRequest

    threads = []

    def chat_prompt(gw, body):
        threads.append(threading.current_thread())
        return [1], None

    monkeypatch.setattr(chat, "chat_prompt", chat_prompt)
    short = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    refusal = {"type": "refusal", "refusal": "no"}  # (text, as a text part)
    call = {"id": "c", "function": {"name": "f", "arguments": "{}"}}
    answer = {"role": "tool", "tool_call_id": "c", "content": "r"}  # (a call must be answered)
    bodies = [
        {"messages": short},
        {"messages": [{"role": "user", "content": "x" * ENCODED_ON_THE_LOOP}]},
        {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [refusal]}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, image]}]},
        {"messages": [{"role": "user", "content": "x" * (ENCODED_ON_THE_LOOP + 1)}]},
        {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "reasoning_content": "y" * 300}]},
        {"messages": short, "tools": [_TOOL]},
        {"messages": short, "response_format": {"type": "json_object"}},
        {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [call]}, answer]},
    ]

    gw = SimpleNamespace(tokenizing=anyio.CapacityLimiter(1))

    async def all_of_them() -> threading.Thread:
        for fields in bodies:
            await chat.prompted(gw, ChatCompletionRequest(model="m", **fields))
        return threading.current_thread()

    loop = asyncio.run(all_of_them())
    assert [thread is loop for thread in threads] == [True, True, True] + [False] * 6


def test_a_chat_of_many_empty_messages_or_parts_is_rendered_off_the_loop(monkeypatch):
    """Rendering costs per message and per content part whatever their text: 256 empty messages
    (0 characters: within the text bound) took 0.8 ms on the loop, 4,096 empty parts 1.6 ms, 20
    times the short chat's. Up to ``RENDERED_ON_THE_LOOP`` parts in all stay on the loop."""
    from services.gateway.chat_schemas import ChatCompletionRequest

    threads = []

    def chat_prompt(gw, body):
        threads.append(threading.current_thread())
        return [1], None

    monkeypatch.setattr(chat, "chat_prompt", chat_prompt)
    most = chat.RENDERED_ON_THE_LOOP
    turns = [{"role": ("user", "assistant")[i % 2], "content": ""} for i in range(256)]
    empty = {"type": "text", "text": ""}
    bodies = [
        {"messages": turns[:most]},
        {"messages": [{"role": "user", "content": [empty] * most}]},
        {"messages": turns},
        {"messages": turns[: most + 1]},
        {"messages": [{"role": "user", "content": [empty] * 1024}] * 4},
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [empty] * most}]},
    ]

    gw = SimpleNamespace(tokenizing=anyio.CapacityLimiter(1))

    async def all_of_them() -> threading.Thread:
        for fields in bodies:
            await chat.prompted(gw, ChatCompletionRequest(model="m", **fields))
        return threading.current_thread()

    loop = asyncio.run(all_of_them())
    assert [thread is loop for thread in threads] == [True, True, False, False, False, False]
