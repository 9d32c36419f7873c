"""Requests for the chat-protocol tests: a weather tool, a person schema, posting, and reading
a chat's raw continuation and streamed tool calls back."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

from .conftest import MODEL

B, E, U, A, D = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "｜DSML｜"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "unit": {"enum": ["c", "f"]},
            },
            "required": ["city", "days"],
        },
    },
}
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
SEEDS = range(20)
PREFIX = {"role": "assistant", "content": "```python\n", "prefix": True}


def post(stack, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{stack.url}{path}", json={"model": MODEL, **body}, timeout=300)


def ask(content: str = "Weather in Paris?", **kw) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 400, **kw}


def valid_person(value) -> bool:
    return (
        isinstance(value, dict)
        and set(value) == {"name", "age", "tags"}
        and isinstance(value["name"], str)
        and len(value["name"]) <= 8
        and type(value["age"]) is int
        and 0 <= value["age"] <= 120
        and isinstance(value["tags"], list)
        and len(value["tags"]) <= 3
        and all(isinstance(t, bool) for t in value["tags"])
    )


def many(stack, bodies: list[dict]) -> list[dict]:
    with ThreadPoolExecutor(len(bodies)) as pool:
        replies = list(pool.map(lambda b: post(stack, "/v1/chat/completions", b), bodies))
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies if r.status_code != 200]
    return [r.json()["choices"][0] for r in replies]


def openai_client(stack):
    from openai import OpenAI

    return OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=300)


def raw_continuation(stack, messages: list[dict], max_tokens: int, **kw) -> tuple[str, list[str]]:
    """The greedy continuation of a chat's prompt from the completions endpoint (no parsing): its
    text and its tokens."""
    chat = {k: kw.pop(k) for k in ("tools", "chat_template_kwargs") if k in kw}
    ids = post(stack, "/tokenize", {"messages": messages, **chat}).json()["tokens"]
    body = {"prompt": ids, "max_tokens": max_tokens, "temperature": 0, "logprobs": 0, **kw}  # kw may sample instead
    choice = post(stack, "/v1/completions", body).json()["choices"][0]
    return choice["text"], choice["logprobs"]["tokens"]


def accumulate_calls(chunks: list[dict]) -> tuple[dict[int, dict], str | None]:
    """Streamed tool-call deltas put together as a client does, and the finish reason."""
    calls, finish = {}, None
    for chunk in chunks:
        choice = chunk["choices"][0]
        finish = choice["finish_reason"] or finish
        for delta in choice["delta"].get("tool_calls", []):
            call = calls.setdefault(delta["index"], {"name": "", "arguments": ""})
            call["name"] += delta.get("function", {}).get("name", "")
            call["arguments"] += delta.get("function", {}).get("arguments", "")
        assert D not in (choice["delta"].get("content") or "")
    return calls, finish
