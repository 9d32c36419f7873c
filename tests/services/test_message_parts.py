"""A message's content parts (services/gateway/message_schemas.py, images.py): the types each role
takes, as OpenAI's API types them (a user's text or image_url, an assistant's text or refusal, the
other roles' text), and a refused part named by its own field. The gateway in-process on a real Redis
(each request here is refused before it queues; /tokenize renders the chat as the generating routes
do), or render_chat alone."""

from __future__ import annotations

import json

import pytest

from dayzero.chat.encoding import encode_chat
from dayzero.vision.images import ImageLimits, PatchSpec
from services.gateway.chat_schemas import ChatCompletionRequest
from services.gateway.errors import APIError
from services.gateway.images import render_chat

from .conftest import MODEL, data_url

CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def _tokens(capped_gateway, messages: list[dict]) -> list[int]:
    r = capped_gateway.post("/tokenize", json={"model": MODEL, "messages": messages})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_an_assistant_s_refusal_part_is_rendered_as_its_text(capped_gateway):
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
    assert _tokens(capped_gateway, chat([refusal])) == _tokens(capped_gateway, chat("I can't help with that."))
    both = [{"type": "text", "text": "Sorry."}, refusal]
    assert _tokens(capped_gateway, chat(both)) == _tokens(capped_gateway, chat("Sorry.\n\nI can't help with that."))


def test_an_assistant_s_refusal_field_is_rendered_as_its_text(capped_gateway):
    """OpenAI's SDK returns a refusal as the message's ``refusal`` field with content null, and a client
    sends the message back so: the field was ignored (an unknown key), the turn rendered empty. Rendered
    as a refusal part is, its text the turn's; with a content too (OpenAI never sends both) after it,
    as a refusal part after a text part."""

    def chat(**assistant: object) -> list[dict]:
        return [{"role": "user", "content": "q"}, {"role": "assistant", **assistant}, {"role": "user", "content": "ok"}]

    refused = "I can't help with that."
    expected = (
        "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜></think>I can't help with that.<｜end▁of▁sentence｜>"
        "<｜User｜>ok<｜Assistant｜></think>"
    )
    assert encode_chat(_rendered(chat(content=None, refusal=refused)).messages) == expected
    tokens = _tokens(capped_gateway, chat(content=None, refusal=refused))
    assert tokens == _tokens(capped_gateway, chat(content=refused))
    assert tokens != _tokens(capped_gateway, chat(content=None))
    both = _tokens(capped_gateway, chat(content="Sorry.", refusal=refused))
    assert both == _tokens(capped_gateway, chat(content=f"Sorry.\n\n{refused}"))
    text, part = {"type": "text", "text": "Sorry."}, {"type": "refusal", "refusal": "no"}
    after_parts = _tokens(capped_gateway, chat(content=[text, part], refusal="x"))
    assert after_parts == _tokens(capped_gateway, chat(content=[text, part, {"type": "text", "text": "x"}]))


def test_a_refusal_outside_an_assistant_message_is_refused(capped_gateway):
    """OpenAI's refusal is an assistant message's field (as a refusal part is an assistant's)."""
    messages = [{"role": "user", "content": "q", "refusal": "no"}]
    r = capped_gateway.post("/tokenize", json={"model": MODEL, "messages": messages})
    error = r.json()["error"]
    assert (r.status_code, error["param"], error["code"]) == (400, "messages[0].refusal", "invalid_value"), error


@pytest.mark.parametrize(
    ("part", "told"),
    [
        ({"type": "input_audio", "input_audio": {}}, "(audio input)"),
        ({"type": "file", "file": {}}, "(a file's contents)"),
    ],
)
def test_a_user_s_audio_or_file_part_is_told_unsupported(capped_gateway, part, told):
    """OpenAI's user content parts are text, image_url, input_audio or file: an audio or file part was
    told invalid_value, "of type 'text' or 'image_url'", as if of no OpenAI type; it is valid there,
    only not served here (unsupported_value, as a custom tool or an allowed_tools choice is)."""
    messages = [{"role": "user", "content": [{"type": "text", "text": "see"}, part]}]
    r = capped_gateway.post("/tokenize", json={"model": MODEL, "messages": messages})
    error = r.json()["error"]
    param = "messages[0].content[1].type"
    assert (r.status_code, error["param"], error["code"]) == (400, param, "unsupported_value"), error
    told = f"type {part['type']!r} {told} is not supported by this server: send 'text' or 'image_url'"
    assert error["message"] == f"{param}: {told}"


REFUSALS_ARE_AN_ASSISTANT_S = " (refusal parts are only allowed in messages with role 'assistant')"
AUDIO_IS_A_USER_S = " (input_audio parts are only allowed in messages with role 'user')"


@pytest.mark.parametrize(
    ("role", "part", "told"),
    [
        ("system", {"type": "input_audio", "input_audio": {}}, "'text', not 'input_audio'" + AUDIO_IS_A_USER_S),
        ("developer", {"type": "refusal", "refusal": "no"}, "'text', not 'refusal'" + REFUSALS_ARE_AN_ASSISTANT_S),
        (
            "user",
            {"type": "refusal", "refusal": "no"},
            "'text' or 'image_url', not 'refusal'" + REFUSALS_ARE_AN_ASSISTANT_S,
        ),
        ("user", {"type": "video_url", "video_url": {}}, "'text' or 'image_url', not 'video_url'"),  # (vLLM's)
        (
            "assistant",
            {"type": "file", "file": {}},
            "'text' or 'refusal', not 'file' (file parts are only allowed in messages with role 'user')",
        ),
        ("tool", {"type": "refusal", "refusal": "no"}, "'text', not 'refusal'" + REFUSALS_ARE_AN_ASSISTANT_S),
        (
            "latest_reminder",
            {"type": "image_url", "image_url": {"url": "x"}},
            "'text', not 'image_url' (image_url parts are only allowed in messages with role 'user')",
        ),
    ],
)
def test_a_part_of_a_type_its_role_does_not_take_is_told_the_role_s_types(capped_gateway, role, part, told):
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
    r = capped_gateway.post("/tokenize", json={"model": MODEL, "messages": messages})
    error = r.json()["error"]
    assert (r.status_code, error["param"], error["code"]) == (400, f"messages[{i}].content[1].type", "invalid_value")
    param = f"messages[{i}].content[1].type"
    assert error["message"] == f"{param}: content parts of a message with role {role!r} are of type {told}"


@pytest.mark.parametrize(
    ("role", "kind", "code"),
    [
        ("system", 3, "invalid_value"),
        ("tool", ["text"], "invalid_value"),
        ("user", None, "invalid_type"),
        ("user", ["input_audio"], "invalid_value"),  # (a user's was looked up among the unserved types: a 500)
        ("user", {"type": "file"}, "invalid_value"),
    ],
)
def test_a_part_type_of_no_string_is_told_the_role_s_types(capped_gateway, role, kind, code):
    """A type that is no string (3, a list, null) was told every role's types, as before the check by
    role: a system message "Input should be 'text', 'image_url' or 'refusal'" (images and refusals are
    no system's). Told its role's now, each with the code it had (null: a required field's invalid_type)."""
    message = {"role": role, "content": [{"type": "text", "text": "see"}, {"type": kind, "text": "a"}]}
    if role == "tool":
        messages = [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [CALL]}]
        messages += [{**message, "tool_call_id": "call_1"}]
    else:
        messages = [message, {"role": "user", "content": "ok"}]
    i = 2 if role == "tool" else 0
    error = capped_gateway.post("/tokenize", json={"model": MODEL, "messages": messages}).json()["error"]
    param = f"messages[{i}].content[1].type"
    assert (error["param"], error["code"]) == (param, code), error
    told = "'text' or 'image_url'" if role == "user" else "'text'"
    told = f"content parts of a message with role {role!r} are of type {told}, not {json.dumps(kind)}"
    assert error["message"] == f"{param}: {told}"


def _rendered(messages: list[dict], vision: bool = True):
    body = ChatCompletionRequest(model=MODEL, messages=messages)
    return render_chat(body.messages, ImageLimits(), PatchSpec(), vision)


def test_a_refused_image_or_text_is_named_by_its_part():
    """An image refused (not base64, not an image, a remote host) or a part's text holding the image
    placeholder named the message's content, messages[1].content, whichever of its parts it was: now
    the part's own field, as a part's refused type is named (OpenAI names the part:
    'messages[0].content[1].type')."""
    image = {"type": "image_url", "image_url": {"url": data_url(16, 16, 1)}}
    text = {"type": "text", "text": "see"}
    for url in ("data:image/png;base64,@@", "data:image/png;base64,AAAA", "https://example.com/a.png"):
        chat = [
            {"role": "user", "content": "q"},
            {"role": "user", "content": [text, image, {**image, "image_url": {"url": url}}]},
        ]
        with pytest.raises(APIError) as refused:
            _rendered(chat)
        assert (refused.value.code, refused.value.param) == ("invalid_image", "messages[1].content[2].image_url.url")
    tag = "<｜deepseek_image｜>"
    for content, param in (
        ([text, {"type": "text", "text": f"a {tag}"}], "messages[0].content[1].text"),
        (f"a {tag}", "messages[0].content"),  # (a string: no part)
    ):
        with pytest.raises(APIError) as refused:
            _rendered([{"role": "user", "content": content}])
        assert (refused.value.code, refused.value.param) == ("invalid_value", param)
    for assistant, param in (
        ({"content": [{"type": "refusal", "refusal": tag}]}, "messages[1].content[0].refusal"),
        ({"content": None, "refusal": tag}, "messages[1].refusal"),  # (the message's field: its own)
    ):
        with pytest.raises(APIError) as refused:
            _rendered([{"role": "user", "content": "q"}, {"role": "assistant", **assistant}])
        assert refused.value.param == param
    with pytest.raises(APIError) as refused:
        _rendered([{"role": "user", "content": [text, image]}], vision=False)
    assert (refused.value.code, refused.value.param) == ("images_unsupported", "messages[0].content[1].type")
