"""What an admission does off the event loop, and only that: a grammar's check and compile (none
asked for: no hop to the thread pool), long prompt text's tokenizing (short text costs less than
the hop and back, on the loop; long text off it: the loop's other requests would wait)."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

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
    gw = SimpleNamespace(codec=codec)

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
