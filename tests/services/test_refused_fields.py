"""What a body is told for a field this server does not implement, an OpenAI parameter (declared, with
its type) or a vLLM / SGLang extension (not OpenAI's: any value), at a value that asks for something
or of the wrong type, alone and beside another field's error (the gateway in-process, on a real Redis:
every request here is refused before it queues); and the ``code`` OpenAI's API gives an invalid field
(they were all null)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from dayzero.settings import Settings
from services.gateway.app import make_app

from .conftest import MODEL, chat

VLLM_ONLY = "(vLLM's) is not supported by this server"
SGLANG_ONLY = "(SGLang's) is not supported by this server"
TEMPERATURE = "temperature: Input should be less than or equal to 2"
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.fixture(scope="module")
def gateway(demo_dir, redis_url):
    with TestClient(make_app(Settings(checkpoint=demo_dir, redis_url=redis_url))) as client:
        yield client


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        # OpenAI's, declared: a value of the wrong type is told so; one that asks for something, why not
        ({"best_of": "1"}, "best_of", "best_of: Input should be a valid integer"),
        ({"best_of": 2}, "best_of", "best_of: best_of must be 1 on this server"),
        ({"suffix": ["x"]}, "suffix", "suffix: Input should be a valid string"),
        ({"suffix": "x"}, "suffix", "suffix: suffix is not supported by this server"),
        # vLLM's and SGLang's: any value but the default is refused, whatever its type
        ({"min_tokens": "0"}, "min_tokens", f"min_tokens: min_tokens other than 0 {VLLM_ONLY}"),
        ({"min_tokens": 3}, "min_tokens", f"min_tokens: min_tokens other than 0 {VLLM_ONLY}"),
        (
            {"skip_special_tokens": "yes"},
            "skip_special_tokens",
            f"skip_special_tokens: skip_special_tokens false {VLLM_ONLY}",
        ),
        ({"regex": 5}, "regex", f"regex: regex {SGLANG_ONLY}; use response_format"),
        # vLLM's usage in every chunk (it was ignored: no chunk but the last had any)
        (
            {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
            "stream_options.continuous_usage_stats",
            f"stream_options.continuous_usage_stats: continuous_usage_stats {VLLM_ONLY}; use include_usage",
        ),
        # beside another field's error as deep: the OpenAI field's in field order, the extension's first
        ({"temperature": 5, "best_of": 2}, "temperature", TEMPERATURE),
        ({"temperature": 5, "min_tokens": 3}, "min_tokens", f"min_tokens: min_tokens other than 0 {VLLM_ONLY}"),
        # beside a deeper error, the deeper one, as for every field (the extension's was: checked first)
        (
            {"stream": True, "stream_options": {"include_usage": "x"}, "min_tokens": 3},
            "stream_options.include_usage",
            "stream_options.include_usage: Input should be a valid boolean",
        ),
    ],
    ids=lambda v: "-".join(f"{k}={v[k]!r}" for k in v) if isinstance(v, dict) else None,
)
def test_what_an_unimplemented_field_is_told(gateway, fields, param, message):
    r = gateway.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1, **fields})
    assert r.status_code == 400, r.text
    code = (
        "invalid_type" if "should be a valid" in message else "decimal_above_max_value" if "less" in message else None
    )
    code = code or "unsupported_value"  # OpenAI's for a value it does not support (it was null)
    assert r.json()["error"] == {"message": message, "type": "invalid_request_error", "param": param, "code": code}


@pytest.mark.parametrize(
    "fields",
    [
        {"best_of": 1, "suffix": ""},
        {"min_tokens": 0, "skip_special_tokens": True, "regex": None},
        {"stream": True, "stream_options": {"continuous_usage_stats": False}},
        # without include_usage vLLM sends no usage to repeat: true asks for nothing (it was refused)
        {"stream": True, "stream_options": {"continuous_usage_stats": True}},
        {"stream": True, "stream_options": {"include_usage": False, "continuous_usage_stats": True}},
    ],
)
def test_defaults_ask_for_nothing_and_pass(gateway, fields):
    r = gateway.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1, "n": 0, **fields})
    assert r.json()["error"]["param"] == "n", r.text  # refused for the one field set wrong on purpose


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        (chat("x", max_tokens=0), "max_tokens", "integer_below_min_value"),  # OpenAI's, for max_tokens 0
        (chat("x", n=9), "n", "integer_above_max_value"),
        (chat("x", temperature=2.5), "temperature", "decimal_above_max_value"),  # OpenAI's, for 2.1
        (chat("x", temperature=-1), "temperature", "decimal_below_min_value"),  # a decimal field, an integer sent
        (chat("x", logit_bias={"5": 101}), 'logit_bias["5"]', "decimal_above_max_value"),  # (its key: was the map)
        (chat("x", max_tokens="4"), "max_tokens", "invalid_type"),
        (chat("x", stream="yes"), "stream", "invalid_type"),
        ({"messages": [{"role": "user", "content": "x"}]}, "model", "missing_required_parameter"),  # no model
        # a required field sent as null is of the wrong type, as a needed content's null is (it was told
        # missing, as if left out)
        ({"model": None, "messages": [{"role": "user", "content": "x"}]}, "model", "invalid_type"),
        ({"model": MODEL, "messages": None}, "messages", "invalid_type"),
        (chat("x", tools=[{"type": "function", "function": None}]), "tools[0].function", "invalid_type"),
        # (a required field of fixed values too: it was invalid_value, "Input should be 'system', ...")
        ({"model": MODEL, "messages": [{"role": None, "content": "x"}]}, "messages[0].role", "invalid_type"),
        (chat("x", tools=[{"type": None, "function": {"name": "f"}}]), "tools[0].type", "invalid_type"),
        # a content part's type, the tag of its kind, as OpenAI tells it ("Missing required parameter:
        # 'messages[2].content[0].type'"): all three named the part, invalid_value
        (chat([{"type": None, "text": "a"}]), "messages[0].content[0].type", "invalid_type"),
        (chat([{"text": "a"}]), "messages[0].content[0].type", "missing_required_parameter"),
        # OpenAI's type, not served here (it was invalid_value, "of type 'text' or 'image_url'")
        (chat([{"type": "input_audio", "input_audio": {}}]), "messages[0].content[0].type", "unsupported_value"),
        (chat([{"type": "video_url", "video_url": {}}]), "messages[0].content[0].type", "invalid_value"),
        # an image's detail of none of OpenAI's values (auto, low, high; it was taken and ignored)
        (
            chat([{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA", "detail": "ultra"}}]),
            "messages[0].content[0].image_url.detail",
            "invalid_value",
        ),
        # a prefix where none can be, named as the message's (it was "messages", told "0.prefix: ...")
        (
            {
                "model": MODEL,
                "messages": [{"role": "assistant", "content": "a", "prefix": True}, *chat("q")["messages"]],
            },
            "messages[0].prefix",
            "invalid_value",
        ),
        (
            {
                "model": MODEL,
                "messages": [*chat("q")["messages"], {"role": "assistant", "prefix": True, "tool_calls": [CALL]}],
            },
            "messages[1].prefix",
            "invalid_value",
        ),
        (chat("x", reasoning_effort="extreme"), "reasoning_effort", "invalid_value"),
        (chat("x", user="u" * 257), "user", "string_above_max_length"),
        (chat("x", store="yes"), "store", "invalid_type"),  # (it was taken, as an unknown key: a 200)
        # OpenAI's, ignored: any value was taken (undeclared keys)
        (chat("x", service_tier="fast"), "service_tier", "invalid_value"),
        (chat("x", prompt_cache_key=5), "prompt_cache_key", "invalid_type"),
        (chat("x", safety_identifier=["u"]), "safety_identifier", "invalid_type"),
        (chat("x", logit_bias={"05": 1}), "logit_bias", "invalid_value"),  # a key that is no token id (was null)
        (chat("x", stop=["s"] * 17), "stop", "array_above_max_length"),  # a check of this server's own (was null)
        # OpenAI's (they were null, a tool's under param "tools"; a list past its bound, read before its
        # items, as pydantic's past max_length)
        ({"model": MODEL, "messages": []}, "messages", "empty_array"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "q"}] * 257}, "messages", "array_above_max_length"),
        # a map's, as OpenAI's API codes metadata's ("too many properties"; they were array_above_max_length)
        (chat("x", logit_bias={str(i): 1 for i in range(301)}), "logit_bias", "object_above_max_properties"),
        (chat("x", metadata={f"k{i}": "v" for i in range(17)}), "metadata", "object_above_max_properties"),
        (
            chat("x", tools=[{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]),
            "tools",
            "array_above_max_length",
        ),
        (
            chat("x", tools=[{"type": "function", "function": {"name": "a b"}}]),
            "tools[0].function.name",
            "invalid_value",
        ),
    ],
)
def test_an_invalid_field_is_coded_as_openai_codes_it(gateway, body, param, code):
    r = gateway.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error"), error


@pytest.mark.parametrize(
    "fields",
    [
        {"store": True},
        {"store": False, "service_tier": None},
        {"service_tier": "flex", "prompt_cache_key": "k", "safety_identifier": "u1"},
    ],
)
def test_openai_s_ignored_parameters_are_taken(gateway, fields):
    """Refused past the body's checks, for a max_tokens over the limit (store true was asserted beside
    n 0, whose error is told whatever store's is: a store true refused passed it)."""
    r = gateway.post("/v1/chat/completions", json=chat("x", max_tokens=10**6, **fields))
    assert (r.status_code, r.json()["error"]["param"]) == (400, "max_tokens"), r.text


@pytest.mark.parametrize(
    ("body", "code"),
    [(b"", "missing_required_parameter"), (b"null", "invalid_type"), (b"[]", "invalid_type")],
    ids=["empty", "null", "list"],
)
def test_a_body_that_is_no_object_names_no_parameter_and_codes_its_fault(gateway, body, code):
    """The body's own error, no field's: param null, and a code that says what is wrong (it was null)."""
    r = gateway.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == (None, code), r.text


@pytest.mark.parametrize(
    ("path", "needed"),
    [
        ("/v1/chat/completions", "messages, model"),
        ("/v1/completions", "model, prompt"),
        ("/tokenize", "model, and messages or prompt"),  # (it was told "model" alone, then refused for it)
        ("/detokenize", "model, tokens"),
    ],
)
def test_an_empty_body_is_told_what_it_needs(gateway, path, needed):
    """It was told pydantic's bare "Field required", of no field."""
    r = gateway.post(path, content=b"", headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == f"the request has no body: send a JSON object with {needed}", r.text


def _past_call(arguments: str, result: str = "r") -> dict:
    """A chat whose assistant turn called f with ``arguments``, answered with ``result``."""
    called = {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": arguments}}]}
    answer = {"role": "tool", "tool_call_id": "c1", "content": result}
    return {"model": MODEL, "messages": [{"role": "user", "content": "q"}, called, answer]}


def _tool(parameters: dict) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (chat("\ud800"), "messages[0].content"),
        (
            chat("x", tools=[_tool({"type": "object", "description": "\udc00"})]),
            "tools[0].function.parameters.description",
        ),
        (
            chat("x", tools=[_tool({"type": "object", "properties": {"\udc00": {}}})]),
            "tools[0].function.parameters.properties",
        ),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "a\ud83d"}]}]},
            "messages[0].content[0].text",
        ),
        (_past_call('{"a": "\ud800"}'), "messages[1].tool_calls[0].function.arguments"),
        (_past_call('{"a": "\\ud800"}'), "messages[1].tool_calls[0].function.arguments"),  # (JSON's escape)
        # arguments that are JSON but no object are rendered as sent (ASCII): the result holds it
        (_past_call('["\\ud800"]', result="\ud800"), "messages[2].content"),
    ],
    ids=["content", "tool", "tool_key", "part", "call_arguments", "escaped_in_call_arguments", "escaped_in_a_list"],
)
def test_a_lone_surrogate_is_refused_in_the_field_that_holds_it(gateway, body, param):
    """The tokenizer refuses the whole rendered prompt: every field's was refused as "messages" (a
    tool's too); a text part's was named with its union tag ("messages[0].content[0].text.text")."""
    r = gateway.post("/v1/chat/completions", content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"].startswith(f"{param}: "), error


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (chat("x", tool_choice={"type": "function"}), "tool_choice.function"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages[0].content[0].text",
        ),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
            "messages[0].content[0].text",
        ),
    ],
    ids=["named_tool_choice", "missing_text", "text_type"],
)
def test_a_union_members_tag_is_no_part_of_the_param(gateway, body, param):
    """It was: "tool_choice.NamedToolChoice.function", "messages[0].content[0].text.text"."""
    r = gateway.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
