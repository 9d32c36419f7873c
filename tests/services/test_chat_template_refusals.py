"""A checkpoint's Jinja chat template that refuses a chat (its ``raise_exception``, as Mistral's and
Llama 2's "roles must alternate" do), cannot continue a prefix (transformers' continue_final_message
finds the prefix's text nowhere in the prompt) or fails on the chat's values (a TypeError: parts joined
to a string by a template that loops over the first message's only): a 400 naming the messages, with
the template's reason. Each was a 500 "internal error". Checked through /tokenize (the gateway
in-process, no workers)."""

from __future__ import annotations

import json
import shutil

import pytest
from fastapi.testclient import TestClient

from dayzero.settings import Settings
from services.gateway.app import make_app

from .conftest import MODEL

END = "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
ALTERNATING = (
    "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "[{{ m['role'] }}]{{ m['content'] }}" + END
)
NO_ASSISTANT_TEXT = (
    "{% for m in messages %}[{{ m['role'] }}]{% if m['role'] != 'assistant' %}{{ m['content'] }}{% endif %}" + END
)
# the first message's parts looped over, a later one's content joined to a string: a TypeError on parts
FIRST_AS_PARTS = (
    "{% for m in messages %}{% if loop.first %}{% for p in m['content'] %}{{ p.text }}{% endfor %}"
    "{% else %}{{ '[' + m['content'] + ']' }}{% endif %}" + END
)
ASK = {"role": "user", "content": "q"}
PARTS = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}


@pytest.mark.parametrize(
    ("template", "messages", "told"),
    [
        (ALTERNATING, [ASK, ASK], "roles must alternate"),
        (NO_ASSISTANT_TEXT, [ASK, {"role": "assistant", "content": "Hello", "prefix": True}], "continue the prefix"),
        (FIRST_AS_PARTS, [PARTS, {"role": "assistant", "content": "x"}, PARTS], "failed on the messages"),
    ],
    ids=["raise_exception", "prefix not printed", "parts joined to a string"],
)
def test_a_template_refusing_the_chat_is_a_400_naming_the_messages(
    demo_dir, redis_url, tmp_path, template, messages, told
):
    checkpoint = shutil.copytree(demo_dir, tmp_path / "templated")
    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    (checkpoint / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    with TestClient(
        make_app(Settings(checkpoint=checkpoint, redis_url=redis_url)), raise_server_exceptions=False
    ) as gw:
        r = gw.post("/tokenize", json={"model": MODEL, "messages": messages})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == ("messages", "invalid_value"), error
    assert told in error["message"], error
