"""Echo on a checkpoint without a tokenizer: the answer's ``token_ids`` start with the prompt's ids,
as a text answer starts with the prompt's text, streamed or not."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from dayzero.sampling import SamplingParams

from .conftest import MODEL, engine_steps, start_stack


@pytest.fixture(scope="module")
def bare_stack(demo_dir, tmp_path_factory):
    bare = shutil.copytree(demo_dir, tmp_path_factory.mktemp("bare") / "ckpt")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bare / name).unlink()
    s = start_stack(bare, tmp_path_factory.mktemp("logs"), {"vision": 1, "prefill": 1, "decode": 1})
    yield s
    s.stop()


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
