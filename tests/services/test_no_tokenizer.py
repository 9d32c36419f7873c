"""A checkpoint downloaded without its tokenizer still serves: token-id prompts in, token ids out."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from dayzero.sampling import SamplingParams

from .conftest import MODEL, chat, engine_steps, start_stack


@pytest.fixture(scope="module")
def bare_stack(demo_dir, tmp_path_factory):
    bare = shutil.copytree(demo_dir, tmp_path_factory.mktemp("bare") / "ckpt")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bare / name).unlink()
    s = start_stack(bare, tmp_path_factory.mktemp("logs"), {"vision": 1, "prefill": 1, "decode": 1})
    yield s
    s.stop()


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
