"""A checkpoint's tokenizer.json may set ``truncation`` (cut every encoding to ``max_length`` tokens)
or ``padding`` (fill each to a fixed length with pad tokens), as one saved from a training script
does: the tokenizers library applies them silently, so a prompt over the context was served cut to
``max_length`` (and "hi" as 40 ids, 37 of them pads). The loader turns both off: the prompt is given
whole, and one over the context is refused with the 400 any other is. Checked through /tokenize (the
gateway in-process, no workers)."""

from __future__ import annotations

import json
import shutil

import pytest
from fastapi.testclient import TestClient
from tokenizers import Tokenizer

from dayzero.settings import Settings
from services.gateway.app import make_app

from .conftest import MODEL

CONTEXT = 256
TRUNCATION = {"direction": "Right", "max_length": 16, "strategy": "LongestFirst", "stride": 0}
PADDING = {
    "strategy": {"Fixed": 40},
    "direction": "Right",
    "pad_to_multiple_of": None,
    "pad_id": 2,
    "pad_type_id": 0,
    "pad_token": "<｜▁pad▁｜>",
}


@pytest.fixture
def gateway(demo_dir, redis_url, tmp_path):
    checkpoint = shutil.copytree(demo_dir, tmp_path / "truncating")
    spec = json.loads((checkpoint / "tokenizer.json").read_text())
    (checkpoint / "tokenizer.json").write_text(json.dumps({**spec, "truncation": TRUNCATION, "padding": PADDING}))
    settings = Settings(checkpoint=checkpoint, redis_url=redis_url, max_context=CONTEXT)
    with TestClient(make_app(settings), raise_server_exceptions=False) as gw:
        yield gw, Tokenizer.from_file(str(demo_dir / "tokenizer.json"))  # (the demo's own: neither set)


def test_a_prompt_over_the_context_is_refused_not_cut(gateway):
    gw, plain = gateway
    prompt = "hello world " * 200  # 2,400 bytes: under the byte bound (200 tokens), under twice the head
    tokens = len(plain.encode(prompt).ids)
    assert tokens > CONTEXT
    r = gw.post("/tokenize", json={"model": MODEL, "prompt": prompt})
    assert r.status_code == 400, r.text  # (was 200: 16 tokens)
    message = f"the prompt has {tokens} tokens; the context limit is {CONTEXT}"
    assert r.json()["error"] == {
        "message": message,
        "type": "invalid_request_error",
        "param": "prompt",
        "code": "context_length_exceeded",
    }


def test_a_prompt_is_given_whole_and_unpadded(gateway):
    gw, plain = gateway
    for prompt in ("hi", "hello world " * 10):  # 3 ids (was 40: 37 pads), 21 (was 16)
        r = gw.post("/tokenize", json={"model": MODEL, "prompt": prompt})
        assert r.status_code == 200 and r.json()["tokens"] == plain.encode(prompt).ids, r.text
