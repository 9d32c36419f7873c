"""Long prompt texts, and chats that are not short text alone, are tokenized on a few threads of their
own (``Gateway.tokenizing``), not on the thread pool every request's hops share: 40 long prompts at
once held all of its 40 threads, and each request's Redis reads (bus.py, through the pool) waited for
one to end."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import anyio
from starlette.concurrency import run_in_threadpool

from services.gateway import chat
from services.gateway.chat_schemas import ChatCompletionRequest
from services.gateway.context import ENCODED_ON_THE_LOOP, encoded

PROMPTS = 50  # more than the thread pool's 40 threads
TOKENIZING = 2


class _Blocked:
    """A tokenizer busy until ``done`` is set; counts the encodes running at once."""

    def __init__(self) -> None:
        self.done, self.lock = threading.Event(), threading.Lock()
        self.running = self.most = 0

    def encode(self, text: str, limit: int | None = None, special: bool = True) -> list[int]:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        self.done.wait()
        with self.lock:
            self.running -= 1
        return [len(text)]


def test_long_prompts_leave_the_thread_pool_to_other_requests():
    """While 50 long prompts are being tokenized, a request's hop to the thread pool still runs,
    and at most ``tokenizing`` of them run at once (the rest wait their turn); all then finish.
    Before, the 40 pool threads all held a prompt and the hop waited for the first to end
    (here: never; in the gateway, seconds)."""
    codec = _Blocked()
    gw = SimpleNamespace(codec=codec, tokenizing=anyio.CapacityLimiter(TOKENIZING))
    text = "x" * (ENCODED_ON_THE_LOOP + 1)
    stuck, ids = _while_blocked(codec, lambda: encoded(gw, text, None))
    assert not stuck and codec.most <= TOKENIZING
    assert ids == [[len(text)]] * PROMPTS


def test_long_chats_leave_the_thread_pool_to_other_requests(monkeypatch):
    """The same for chats (/v1/chat/completions, /tokenize's messages): one of long text renders and
    tokenizes off the loop (``chat.prompted``), on ``tokenizing``'s threads. On the pool's, 50 chats
    of 257 characters each held its 40 and the hop waited for the first to end (here: never)."""
    codec = _Blocked()
    monkeypatch.setattr(chat, "chat_prompt", lambda gw, body: (codec.encode(body.messages[0].content), None))
    gw = SimpleNamespace(tokenizing=anyio.CapacityLimiter(TOKENIZING))
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x" * (ENCODED_ON_THE_LOOP + 1)}])
    stuck, prompts = _while_blocked(codec, lambda: chat.prompted(gw, body))
    assert not stuck and codec.most <= TOKENIZING
    assert prompts == [([ENCODED_ON_THE_LOOP + 1], None)] * PROMPTS


def _while_blocked(codec: _Blocked, prompt) -> tuple[bool, list]:
    """``PROMPTS`` of ``prompt()`` at once on a blocked ``codec``: whether a hop to the thread pool
    meanwhile was stuck (30 s), and what each then returned."""

    async def main() -> tuple[bool, list]:
        prompts = asyncio.gather(*(prompt() for _ in range(PROMPTS)))
        try:
            await asyncio.sleep(0)  # (the prompts start)
            with anyio.move_on_after(30) as waited:  # (a hop stuck behind the prompts: fail, not hang)
                await run_in_threadpool(lambda: None)
        finally:
            codec.done.set()
        return waited.cancelled_caught, await prompts

    return asyncio.run(main())
