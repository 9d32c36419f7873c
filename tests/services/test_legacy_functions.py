"""OpenAI's deprecated functions protocol in a chat's history, and the other assistant fields: an
assistant's ``function_call`` ({"name", "arguments"}: one call, before ``tool_calls``) and a
``function`` message (its result, naming the function) render as the tool call and the tool result
they stand for; a past ``audio`` reply, which this server never makes, is a 400 naming it. Each was
dropped: the call's turn rendered empty, the audio's too, and a function message was told its role
was not one. A participant's ``name`` is given to a Jinja template, as transformers gives it (V4's
encoding, as DeepSeek's, has no place for one). The gateway in-process, no workers: /tokenize
renders the chat a completion is given."""

from __future__ import annotations

import json
import shutil

import pytest
from fastapi.testclient import TestClient

from dayzero.settings import Settings
from services.gateway.app import make_app

from .conftest import MODEL

ASK = {"role": "user", "content": "What is 6 x 7?"}
LEGACY_CALL = {"role": "assistant", "content": None, "function_call": {"name": "mul", "arguments": '{"a": 6}'}}
LEGACY = [ASK, LEGACY_CALL, {"role": "function", "name": "mul", "content": "42"}]
# the same chat in OpenAI's current form: the call's id is the function's name, which its result names
CURRENT = [
    ASK,
    {"role": "assistant", "tool_calls": [{"id": "mul", "type": "function", "function": LEGACY_CALL["function_call"]}]},
    {"role": "tool", "tool_call_id": "mul", "content": "42"},
]


@pytest.fixture(scope="module")
def gateway(demo_dir, redis_url):
    with TestClient(make_app(Settings(checkpoint=demo_dir, redis_url=redis_url))) as client:
        yield client


def _tokenize(gateway, messages: list[dict]):
    return gateway.post("/tokenize", json={"model": MODEL, "messages": messages})


def _prompt(gateway, messages: list[dict]) -> str:
    r = _tokenize(gateway, messages)
    assert r.status_code == 200, r.text
    return gateway.post("/detokenize", json={"model": MODEL, "tokens": r.json()["tokens"]}).json()["prompt"]


def test_a_function_call_and_its_result_render_as_the_tool_call_and_result_they_stand_for(gateway):
    prompt = _prompt(gateway, LEGACY)
    assert prompt == _prompt(gateway, CURRENT)
    # V4's DSML call block and tool result, as DeepSeek's encoding_dsv4 writes them
    call = '<｜DSML｜invoke name="mul">\n<｜DSML｜parameter name="a" string="false">6</｜DSML｜parameter>'
    assert call in prompt and "<｜User｜><tool_result>42</tool_result><｜Assistant｜>" in prompt, prompt


UNANSWERED = [ASK, LEGACY_CALL, {"role": "user", "content": "and?"}]
BOTH = {**LEGACY_CALL, "tool_calls": CURRENT[1]["tool_calls"]}


@pytest.mark.parametrize(
    ("messages", "param", "code"),
    [
        ([ASK, {"role": "assistant", "audio": {"id": "audio_abc"}}, ASK], "messages[1].audio", "unsupported_value"),
        (UNANSWERED, "messages[1].function_call", "invalid_value"),
        ([ASK, BOTH, CURRENT[2]], "messages[1].function_call", "invalid_value"),
        ([{**ASK, "function_call": LEGACY_CALL["function_call"]}], "messages[0].function_call", "invalid_value"),
        ([*LEGACY[:2], {"role": "function", "content": "42"}], "messages[2].name", "missing_required_parameter"),
        ([*LEGACY[:2], {"role": "function", "name": "add", "content": "42"}], "messages[2].name", "invalid_value"),
        ([ASK, LEGACY[2]], "messages[1].role", "invalid_value"),
    ],
    ids=["audio", "unanswered", "both forms", "not an assistant's", "result unnamed", "result of no call", "stray"],
)
def test_what_cannot_be_rendered_is_refused_naming_the_field(gateway, messages, param, code):
    r = _tokenize(gateway, messages)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == (param, code), error


def test_a_lone_surrogate_in_a_function_calls_arguments_is_named_there(gateway):
    """Its arguments render decoded from JSON, as a tool call's do: ``"\\ud800"`` (ASCII as sent) is a
    lone surrogate in the prompt, refused naming the field, not all of ``messages``."""
    call = {**LEGACY_CALL, "function_call": {"name": "mul", "arguments": '{"a": "\\ud800"}'}}
    body = json.dumps({"model": MODEL, "messages": [ASK, call, LEGACY[2]]})
    r = gateway.post("/tokenize", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "messages[1].function_call.arguments", r.text


NAMED = [{"role": "system", "content": "Be brief.", "name": "rules"}, {**ASK, "name": "ann"}]
TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}{% if m['name'] %} {{ m['name'] }}{% endif %}]{{ m['content'] }}"
    "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
)


def test_a_participants_name_is_given_to_a_template_as_transformers_gives_it(demo_dir, redis_url, tmp_path):
    from transformers import AutoTokenizer

    templated = shutil.copytree(demo_dir, tmp_path / "templated")
    config = json.loads((templated / "tokenizer_config.json").read_text())
    (templated / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    with TestClient(make_app(Settings(checkpoint=templated, redis_url=redis_url))) as templated_gateway:
        r = _tokenize(templated_gateway, NAMED)
    assert r.status_code == 200, r.text
    reference = AutoTokenizer.from_pretrained(str(templated)).apply_chat_template(
        NAMED, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert r.json()["tokens"] == list(reference)


TOOL_CALL = CURRENT[1]["tool_calls"][0]


@pytest.mark.parametrize(
    ("messages", "told"),
    [
        # a function message answering a tool call by its function's name: that call's function is named so
        ([ASK, {**CURRENT[1], "tool_calls": [{**TOOL_CALL, "id": "call_1"}]}, LEGACY[2]], "answered by tool messages"),
        (UNANSWERED, "answered by a function message"),  # (not a tool message: the call is a function_call)
    ],
    ids=["function message for a tool call", "function_call unanswered"],
)
def test_a_refusal_names_the_message_that_answers_the_form_of_call(gateway, messages, told):
    r = _tokenize(gateway, messages)
    assert r.status_code == 400, r.text
    assert told in r.json()["error"]["message"], r.text
