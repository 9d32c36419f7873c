"""A message's content parts (services/gateway/message_schemas.py): the types each role takes, as
OpenAI's API types them (a user's text or image_url, an assistant's text or refusal, the other roles'
text). The gateway in-process on a real Redis: each request here is refused before it queues, and
/tokenize renders the chat as the generating routes do."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from dayzero.settings import Settings
from services.gateway.app import make_app

from .conftest import MODEL

CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.fixture(scope="module")
def http(demo_dir, redis_url):
    with TestClient(make_app(Settings(checkpoint=demo_dir, redis_url=redis_url))) as client:
        yield client


def _tokens(http, messages: list[dict]) -> list[int]:
    r = http.post("/tokenize", json={"model": MODEL, "messages": messages})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_an_assistant_s_refusal_part_is_rendered_as_its_text(http):
    """OpenAI's assistant content parts are text or refusal (``{"type": "refusal", "refusal": ...}``: a
    client sends its model's refusal back in the history), and vLLM renders a refusal as text; it was
    a 400 ("Input should be 'text' or 'image_url'"). Rendered as the text would be, joined to a text
    part by a blank line as two text parts are."""

    def chat(content: object) -> list[dict]:
        return [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": content},
            {"role": "user", "content": "ok"},
        ]

    refusal = {"type": "refusal", "refusal": "I can't help with that."}
    assert _tokens(http, chat([refusal])) == _tokens(http, chat("I can't help with that."))
    both = [{"type": "text", "text": "Sorry."}, refusal]
    assert _tokens(http, chat(both)) == _tokens(http, chat("Sorry.\n\nI can't help with that."))


REFUSALS_ARE_AN_ASSISTANT_S = " (refusal parts are only allowed in messages with role 'assistant')"


@pytest.mark.parametrize(
    ("role", "part", "told"),
    [
        ("system", {"type": "input_audio", "input_audio": {}}, "'text', not 'input_audio'"),
        ("developer", {"type": "refusal", "refusal": "no"}, "'text', not 'refusal'" + REFUSALS_ARE_AN_ASSISTANT_S),
        (
            "user",
            {"type": "refusal", "refusal": "no"},
            "'text' or 'image_url', not 'refusal'" + REFUSALS_ARE_AN_ASSISTANT_S,
        ),
        ("user", {"type": "file", "file": {}}, "'text' or 'image_url', not 'file'"),
        ("assistant", {"type": "input_audio", "input_audio": {}}, "'text' or 'refusal', not 'input_audio'"),
        ("tool", {"type": "refusal", "refusal": "no"}, "'text', not 'refusal'" + REFUSALS_ARE_AN_ASSISTANT_S),
        (
            "latest_reminder",
            {"type": "image_url", "image_url": {"url": "x"}},
            "'text', not 'image_url' (image_url parts are only allowed in messages with role 'user')",
        ),
    ],
)
def test_a_part_of_a_type_its_role_does_not_take_is_told_the_role_s_types(http, role, part, told):
    """A part's type outside its role's was told every role's types whatever the role ("Input should be
    'text' or 'image_url'": a system message told of images, an assistant's not of refusals); a refusal
    outside an assistant message is refused as OpenAI's types refuse it."""
    message = {"role": role, "content": [{"type": "text", "text": "see"}, part]}
    if role == "tool":
        messages = [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [CALL]}]
        messages += [{**message, "tool_call_id": "call_1"}]
    else:
        messages = [{"role": "user", "content": "q"}, message, {"role": "user", "content": "ok"}]
    i = 2 if role == "tool" else 1
    r = http.post("/tokenize", json={"model": MODEL, "messages": messages})
    error = r.json()["error"]
    assert (r.status_code, error["param"], error["code"]) == (400, f"messages[{i}].content[1].type", "invalid_value")
    param = f"messages[{i}].content[1].type"
    assert error["message"] == f"{param}: content parts of a message with role {role!r} are of type {told}"
