"""A system, developer, user or tool message without content (left out, or null as a client writes an
unset variable) is refused as OpenAI's API refuses it: 400 naming ``messages[i].content``, code
``missing_required_parameter`` for one left out and ``invalid_type`` for a null (OpenAI: "expected a
string, got null"; it was missing_required_parameter too); so is V4's latest_reminder (a reminder of
nothing). A tool message without its ``tool_call_id`` likewise (it was served as the first call's
result: the encoder sorts the results by their calls' ids). It was served as an empty turn (a user message of nothing, a
tool result of nothing), the client's mistake unseen. An assistant message may still leave it out
beside its calls (OpenAI's shape), or with nothing: OpenAI's reference asks content of one without
calls, but vLLM renders it, so it is not refused here. In-process gateway on a real Redis: each
request here is refused before it queues, /tokenize too (it renders the same chat)."""

from __future__ import annotations

import openai
import pytest
from fastapi.testclient import TestClient

from dayzero.settings import Settings
from services.gateway.app import make_app

from .conftest import MODEL, data_url

CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
ASKED = [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [CALL]}]


@pytest.fixture(scope="module")
def http(demo_dir, redis_url):
    with TestClient(make_app(Settings(checkpoint=demo_dir, redis_url=redis_url))) as client:
        yield client


@pytest.fixture
def client(http):
    return openai.OpenAI(base_url=f"{http.base_url}/v1", api_key="k", http_client=http, max_retries=0)


def _without_content(role: str, null: bool) -> tuple[list[dict], int]:
    """A chat whose message of ``role`` has no content (null, or left out), and that message's index."""
    message = {"role": role, **({"content": None} if null else {})}
    if role == "tool":
        return [*ASKED, {**message, "tool_call_id": "call_1"}], 2
    return [message, {"role": "user", "content": "hi"}] if role != "user" else [message], 0


@pytest.mark.parametrize("null", [False, True], ids=["left_out", "null"])
@pytest.mark.parametrize("role", ["system", "developer", "user", "tool", "latest_reminder"])
def test_a_message_without_content_is_refused_naming_it(client, http, role, null):
    messages, i = _without_content(role, null)
    tokenized = http.post("/tokenize", json={"model": MODEL, "messages": messages})
    assert tokenized.status_code == 400 and tokenized.json()["error"]["param"] == f"messages[{i}].content"

    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert refused.value.param == f"messages[{i}].content", refused.value.body
    assert refused.value.code == ("invalid_type" if null else "missing_required_parameter")
    assert f"a {role} message needs content" in refused.value.message


@pytest.mark.parametrize("null", [False, True], ids=["left_out", "null"])
def test_a_tool_message_without_its_call_id_is_refused_naming_it(client, http, null):
    messages = [*ASKED, {"role": "tool", "content": "done", **({"tool_call_id": None} if null else {})}]
    tokenized = http.post("/tokenize", json={"model": MODEL, "messages": messages})
    assert tokenized.status_code == 400 and tokenized.json()["error"]["param"] == "messages[2].tool_call_id"

    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert refused.value.param == "messages[2].tool_call_id", refused.value.body
    assert refused.value.code == ("invalid_type" if null else "missing_required_parameter")
    assert "a tool message needs tool_call_id" in refused.value.message


@pytest.mark.parametrize(
    "assistant",
    [{"role": "assistant", "tool_calls": [CALL]}, {"role": "assistant", "content": None}, {"role": "assistant"}],
    ids=["calls", "null", "left_out"],
)
def test_an_assistant_message_may_leave_its_content_out(http, assistant):
    messages = [{"role": "user", "content": "hi"}, assistant, {"role": "user", "content": "again"}]
    if "tool_calls" in assistant:
        messages.insert(2, {"role": "tool", "tool_call_id": "call_1", "content": "done"})
    tokenized = http.post("/tokenize", json={"model": MODEL, "messages": messages})
    assert tokenized.status_code == 200, tokenized.text


def _with_image(role: str) -> tuple[list[dict], int]:
    """A chat whose message of ``role`` holds an image part, and that message's index."""
    parts = [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": data_url(16, 16, 3)}}]
    message = {"role": role, "content": parts}
    if role == "tool":
        return [*ASKED, {**message, "tool_call_id": "call_1"}], 2
    if role == "assistant":
        return [{"role": "user", "content": "hi"}, message, {"role": "user", "content": "again"}], 1
    return [message, {"role": "user", "content": "hi"}] if role != "user" else [message], 0


@pytest.mark.parametrize("role", ["system", "developer", "assistant", "tool", "latest_reminder"])
def test_an_image_outside_a_user_message_is_refused_naming_its_part(http, role):
    """OpenAI's rule ("Image URLs are only allowed for messages with role 'user'": openai/openai-node#1030):
    such an image was encoded and shown to the model inside a system prompt or a reply."""
    messages, i = _with_image(role)
    for path, fields in (("/v1/chat/completions", {"max_tokens": 10**6}), ("/tokenize", {})):
        r = http.post(path, json={"model": MODEL, "messages": messages, **fields})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert (error["param"], error["code"]) == (f"messages[{i}].content[1].type", "invalid_value"), error
        assert error["message"].endswith("(image_url parts are only allowed in messages with role 'user')")
    assert http.post("/tokenize", json={"model": MODEL, "messages": _with_image("user")[0]}).status_code == 200
