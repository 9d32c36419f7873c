"""A checkpoint downloaded without its tokenizer still serves: token-id prompts in, token ids out
(as they come, an echoed prompt's first)."""

from __future__ import annotations

import json

import httpx

from dayzero.sampling import SamplingParams

from .conftest import MODEL, chat
from .in_process import engine_steps


def test_token_ids_are_served_and_text_is_refused_clearly(bare_stack, demo_dir):
    url = f"{bare_stack.url}/v1/completions"
    body = {"model": MODEL, "prompt": [0, 11, 12, 13], "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    r = httpx.post(url, json=body, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    greedy = engine_steps(demo_dir, [0, 11, 12, 13], SamplingParams(max_tokens=5, ignore_eos=True))
    assert choice["text"] == "" and choice["token_ids"] == [step.token for step in greedy]
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=120) as streamed:
        chunks = [json.loads(line[6:]) for line in streamed.iter_lines() if line.startswith("data: {")]
    assert [t for c in chunks for t in c["choices"][0].get("token_ids", [])] == choice["token_ids"]
    with httpx.stream("POST", url, json={**body, "stream": True, "max_tokens": 24}, timeout=120) as streamed:
        chunks = [json.loads(line[6:]) for line in streamed.iter_lines() if line.startswith("data: {")]
    streamed_ids = [c["choices"][0]["token_ids"] for c in chunks if c["choices"][0]["finish_reason"] is None]
    assert len(streamed_ids) >= 2 and all(streamed_ids)  # as they come (all 24 came in the last chunk)
    for refused, param in (({**body, "prompt": "hello"}, None), ({**body, "stop": ["x"]}, "stop")):
        r = httpx.post(url, json=refused, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert "no tokenizer.json" in r.json()["error"]["message"]
    r = httpx.post(f"{bare_stack.url}/v1/chat/completions", json=chat("hi"), timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "no_tokenizer"


def _greedy(demo_dir, prompt: list[int], n: int) -> list[int]:
    return [s.token for s in engine_steps(demo_dir, prompt, SamplingParams(max_tokens=n, ignore_eos=True))]


def _streamed(url: str, body: dict) -> dict[int, list[int]]:
    """Each choice's token ids, over all chunks of a stream."""
    ids: dict[int, list[int]] = {}
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    ids.setdefault(choice["index"], []).extend(choice.get("token_ids", []))
    return ids


def test_echo_puts_the_prompt_ids_first(bare_stack, demo_dir):
    url = f"{bare_stack.url}/v1/completions"
    body = {"model": MODEL, "prompt": [3, 14, 15], "echo": True, "max_tokens": 2, "temperature": 0, "ignore_eos": True}
    generated = _greedy(demo_dir, [3, 14, 15], 2)
    assert len(generated) == 2
    r = httpx.post(url, json=body, timeout=120)
    assert r.status_code == 200, r.text
    (choice,) = r.json()["choices"]
    assert choice["text"] == "" and choice["token_ids"] == [3, 14, 15, *generated]
    assert r.json()["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert _streamed(url, body) == {0: [3, 14, 15, *generated]}
    plain = httpx.post(url, json={**body, "echo": False}, timeout=120).json()["choices"][0]
    assert plain["token_ids"] == generated  # without echo: only the completion's


def test_each_prompt_echoes_its_own_ids(bare_stack, demo_dir):
    url = f"{bare_stack.url}/v1/completions"
    prompts = [[3, 14, 15], [0, 11]]
    body = {"model": MODEL, "prompt": prompts, "echo": True, "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    expected = {i: [*p, *_greedy(demo_dir, p, 3)] for i, p in enumerate(prompts)}
    r = httpx.post(url, json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert {c["index"]: c["token_ids"] for c in r.json()["choices"]} == expected
    assert _streamed(url, body) == expected
