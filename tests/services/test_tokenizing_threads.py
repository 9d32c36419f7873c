"""Long prompt texts, and long chats, are tokenized on a few threads of their own (``Gateway.tokenizing``),
not on the thread pool every request's hops share: 40 long prompts at once held all of its 40 threads,
and each request's Redis reads (bus.py, through the pool) waited for one to end. Text of ordinary
length stays on the pool: behind the long ones on their few threads, it waited for them all."""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from types import SimpleNamespace

import anyio
from starlette.concurrency import run_in_threadpool

from dayzero.cgroups import usable_cpus
from services.gateway import chat, context
from services.gateway.chat_schemas import ChatCompletionRequest
from services.gateway.context import TOKENIZED_APART, encoded

PROMPTS = 50  # more than the thread pool's 40 threads
TOKENIZING = 2
LONG, ORDINARY = "x" * (TOKENIZED_APART + 1), "x" * TOKENIZED_APART


class _Blocked:
    """A tokenizer busy on long text until ``done`` is set; counts the encodes running at once."""

    def __init__(self) -> None:
        self.done, self.lock = threading.Event(), threading.Lock()
        self.running = self.most = 0

    def encode(self, text: str, limit: int | None = None, special: bool = True) -> list[int]:
        if len(text) <= TOKENIZED_APART:
            return [len(text)]
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        self.done.wait()
        with self.lock:
            self.running -= 1
        return [len(text)]


def _chat(text: str) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": text}])


def test_long_prompts_leave_the_thread_pool_to_other_requests():
    """While 50 long prompts are being tokenized, a request's hop to the thread pool still runs,
    and at most ``tokenizing`` of them run at once (the rest wait their turn); all then finish.
    Before, the 40 pool threads all held a prompt and the hop waited for the first to end
    (here: never; in the gateway, seconds)."""
    codec = _Blocked()
    gw = SimpleNamespace(codec=codec, tokenizing=anyio.CapacityLimiter(TOKENIZING))
    stuck, ids, _ = _while_blocked(codec, lambda: encoded(gw, LONG, None), lambda: run_in_threadpool(lambda: None))
    assert not stuck and codec.most <= TOKENIZING
    assert ids == [[len(LONG)]] * PROMPTS


def test_long_chats_leave_the_thread_pool_to_other_requests(monkeypatch):
    """The same for chats (/v1/chat/completions, /tokenize's messages: ``chat.prompted``). On the
    pool's threads, 50 long chats held its 40 and the hop waited for the first to end (here: never)."""
    codec = _Blocked()
    monkeypatch.setattr(chat, "chat_prompt", lambda gw, body: (codec.encode(body.messages[0].content), None))
    gw = SimpleNamespace(tokenizing=anyio.CapacityLimiter(TOKENIZING))
    prompt = lambda: chat.prompted(gw, _chat(LONG))  # noqa: E731
    stuck, prompts, _ = _while_blocked(codec, prompt, lambda: run_in_threadpool(lambda: None))
    assert not stuck and codec.most <= TOKENIZING
    assert prompts == [([len(LONG)], None)] * PROMPTS


def test_text_of_ordinary_length_does_not_wait_behind_the_long(monkeypatch):
    """A prompt, or a chat, of ``TOKENIZED_APART`` characters is tokenized while 50 long ones hold
    ``tokenizing``'s threads. On them, it waited for the 50 to end (here: never; in the gateway, 1,000
    characters behind 40 long prompts: 16 s, against 2.9 s on the pool's)."""
    codec = _Blocked()
    monkeypatch.setattr(chat, "chat_prompt", lambda gw, body: (codec.encode(body.messages[0].content), None))
    gw = SimpleNamespace(codec=codec, tokenizing=anyio.CapacityLimiter(TOKENIZING))

    async def both() -> tuple:
        return await encoded(gw, ORDINARY, None), await chat.prompted(gw, _chat(ORDINARY))

    stuck, _, ordinary = _while_blocked(codec, lambda: encoded(gw, LONG, None), both)
    assert not stuck and ordinary == ([len(ORDINARY)], ([len(ORDINARY)], None))


def test_a_chat_is_long_by_its_text_or_by_work_its_text_does_not_measure():
    """Content, reasoning and calls' arguments count together; an image (decoded), tools, a reply
    schema (rendered) or more than ``LONG_PARTS`` parts make a chat long whatever its text."""
    half = "x" * (TOKENIZED_APART // 2)
    call = {"id": "c", "function": {"name": "f", "arguments": f'{{"a": "{half}"}}'}}
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    turns = {
        "ordinary": ([{"role": "user", "content": ORDINARY}], {}),
        "long": ([{"role": "user", "content": LONG}], {}),
        "reasoning": ([{"role": "user", "content": half}, {"role": "assistant", "reasoning_content": half + "x"}], {}),
        "arguments": ([{"role": "user", "content": half}, {"role": "assistant", "tool_calls": [call]}], {}),
        "image": ([{"role": "user", "content": [{"type": "text", "text": "hi"}, image]}], {}),
        "tools": ([{"role": "user", "content": "hi"}], {"tools": [tool]}),
        "schema": ([{"role": "user", "content": "hi"}], {"response_format": schema}),
        "parts": ([{"role": "user", "content": [{"type": "text", "text": ""}] * (chat.LONG_PARTS + 1)}], {}),
        "few parts": ([{"role": "user", "content": [{"type": "text", "text": ""}] * chat.LONG_PARTS}], {}),
    }
    answer = {"role": "tool", "tool_call_id": "c", "content": ""}
    long = {
        name: chat._long(ChatCompletionRequest(model="m", messages=[*m, answer] if name == "arguments" else m, **kw))
        for name, (m, kw) in turns.items()
    }
    assert long == {name: name not in ("ordinary", "few parts") for name in turns}


def _while_blocked(codec: _Blocked, prompt, meanwhile) -> tuple[bool, list, object]:
    """``PROMPTS`` of ``prompt()`` at once on a blocked ``codec``, and ``meanwhile()``: whether it was
    stuck behind them (30 s), what each prompt then returned, and what it returned."""

    async def main() -> tuple[bool, list, object]:
        prompts = asyncio.gather(*(prompt() for _ in range(PROMPTS)))
        done = None
        try:
            await asyncio.sleep(0)  # (the prompts start)
            with anyio.move_on_after(30) as waited:  # (stuck behind the prompts: fail, not hang)
                done = await meanwhile()
        finally:
            codec.done.set()
        return waited.cancelled_caught, await prompts, done

    return asyncio.run(main())


def test_the_gateways_tokenizing_threads_are_the_cpus_its_cgroup_quota_allows(tmp_path, monkeypatch):
    """A 2-CPU pod (cpu.max "200000 100000") on a 64-core node: its affinity shows all 64, and 64
    tokenizations ran at once, throttled by the quota; now 2 do."""
    (tmp_path / "cpu.max").write_text("200000 100000\n")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(context, "usable_cpus", functools.partial(usable_cpus, tmp_path, tmp_path / "no-self"))
    gw = context.Gateway(None, None, None, None, context_limit=1, vocab_size=1, image_token=None, eos_token=0)
    assert gw.tokenizing.total_tokens == 2
