"""Request bodies as pydantic validates them: null means the default, numbers are finite, and a
schema constrained decoding must enforce is one it can."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.gateway.chat_schemas import ChatCompletionRequest
from services.gateway.schemas import MAX_STOP, CompletionRequest
from services.gateway.tokenize_schemas import TokenizeRequest

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": "hi"}
# OpenAI's nullable fields (the spec's "nullable: true"); user is accepted and ignored
NULLABLE = (
    "temperature",
    "top_p",
    "n",
    "stream",
    "stream_options",
    "presence_penalty",
    "frequency_penalty",
    "logprobs",
    "seed",
    "stop",
    "max_tokens",
    "logit_bias",
    "user",
)
BAD_TOOL = {"type": "function", "function": {"name": "a", "parameters": {"type": "objectx"}}}
GOOD_TOOL = {"type": "function", "function": {"name": "b", "parameters": {"type": "object"}}}


def _refusal(model, body: dict) -> dict:
    with pytest.raises(ValidationError) as refused:
        model.model_validate(body)
    (error,) = refused.value.errors()
    return error


@pytest.mark.parametrize(
    ("model", "body", "extra"),
    [
        (ChatCompletionRequest, CHAT, ("top_logprobs", "max_completion_tokens", "response_format", "tools")),
        (CompletionRequest, COMPLETION, ("echo", "best_of", "suffix")),
    ],
)
def test_null_fields_take_their_defaults(model, body, extra):
    nulls = dict.fromkeys((*NULLABLE, *extra))
    assert model.model_validate({**body, **nulls}) == model.model_validate(body)
    assert model.model_validate({**body, "temperature": None}).temperature == 1.0  # OpenAI's default


@pytest.mark.parametrize(
    ("field", "value"), [("temperature", 2.5), ("top_p", -0.1), ("n", 0), ("presence_penalty", -3.0)]
)
def test_range_checks_still_hold(field, value):
    assert _refusal(ChatCompletionRequest, {**CHAT, field: value})["loc"] == (field,)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("field", ["temperature", "top_p", "frequency_penalty"])
def test_numbers_must_be_finite(field, value):
    error = _refusal(CompletionRequest, {**COMPLETION, field: value})
    assert error["loc"] == (field,) and error["msg"] == "Input should be a finite number"
    bias = _refusal(CompletionRequest, {**COMPLETION, "logit_bias": {"7": value}})
    assert bias["loc"] == ("logit_bias", "7") and bias["msg"] == "Input should be a finite number"


def test_body_validation_compiles_no_grammar(monkeypatch):
    """Whether llguidance can enforce a schema is the route's check (chat.grammar, in a thread): it
    compiles, seconds for some schemas (8000 $defs: 4.6 s), and in the body's validators every
    other request on the gateway waited for it. tests/services/test_errors: the same 400s."""
    import llguidance

    def compile_(*_args, **_kwargs):
        raise AssertionError("a grammar compiled while the body was validated")

    monkeypatch.setattr(llguidance, "LLMatcher", compile_)
    cycle = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": cycle}}
    ChatCompletionRequest.model_validate({**CHAT, "response_format": fmt})
    CompletionRequest.model_validate({**COMPLETION, "response_format": fmt})
    uncompilable = {"type": "function", "function": {"name": "a", "parameters": {"properties": {"k": {"type": "x"}}}}}
    ChatCompletionRequest.model_validate({**CHAT, "tools": [GOOD_TOOL, uncompilable], "tool_choice": "required"})


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "a"}}])
def test_an_enforced_tool_whose_call_would_drop_a_keyword_is_refused_at_its_field(choice):
    dropped = {"type": "function", "function": {"name": "a", "parameters": {"type": "object", "required": ["q"]}}}
    error = _refusal(ChatCompletionRequest, {**CHAT, "tools": [GOOD_TOOL, dropped], "tool_choice": choice})
    assert error["loc"] == ("tools", 1, "function", "parameters")
    assert error["msg"] == "cannot enforce the parameters of tool 'a': " + (
        'required ["q"]: not among the properties, a call cannot write it'
    )


@pytest.mark.parametrize("choice", ["auto", "none", {"type": "function", "function": {"name": "b"}}])
def test_a_tool_schema_no_grammar_enforces_is_only_shown_to_the_model(choice):
    body = ChatCompletionRequest.model_validate({**CHAT, "tools": [GOOD_TOOL, BAD_TOOL], "tool_choice": choice})
    assert body.tools == [GOOD_TOOL, BAD_TOOL]


def test_stop_strings_are_limited_in_number():
    stops = [f"s{i}" for i in range(MAX_STOP)]
    assert CompletionRequest.model_validate({**COMPLETION, "stop": stops}).stops() == tuple(stops)
    error = _refusal(CompletionRequest, {**COMPLETION, "stop": [*stops, "one more"]})
    assert error["loc"] == ("stop",) and error["msg"] == f"at most {MAX_STOP} stop strings, not {MAX_STOP + 1}"


@pytest.mark.parametrize(
    ("model", "body", "where", "limit"),
    [
        (CompletionRequest, {"model": "m", "prompt": [[0]] * 40 + ["x"] * 2}, "prompt", 32),
        (CompletionRequest, {"model": "m", "prompt": [0] * ((1 << 20) + 1)}, "prompt", 1 << 20),
        (ChatCompletionRequest, {"model": "m", "messages": [{"role": "x"}] * 300}, "messages", 256),
        (
            ChatCompletionRequest,
            {"model": "m", "messages": [{"role": "user", "content": [{"type": "x"}] * 1100}]},
            "messages.0.content",
            1024,
        ),
        (
            ChatCompletionRequest,
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [1] * 1100},
            "tools",
            1024,  # the most DAYZERO_MAX_TOOLS takes (the gateway holds a request to it: 128 by default)
        ),
    ],
)
def test_a_list_past_its_bound_is_refused_before_its_items_are_read(model, body, where, limit):
    """Its items are invalid here (a role "x", a part of type "x", a tool 1): the one error is the
    count, so no item was validated (pydantic checks max_length after validating every item)."""
    with pytest.raises(ValidationError) as refused:
        model.model_validate(body)
    errors = refused.value.errors()
    assert len(errors) == 1 and ".".join(map(str, errors[0]["loc"])) == where, errors
    assert f"at most {limit} " in errors[0]["msg"], errors


def test_an_integer_field_takes_an_integral_number_only():
    """JSON has one number type (JSON Schema's integer admits 16.0, as OpenAI and vLLM do)."""
    body = {"model": "m", "prompt": "hi", "max_tokens": 16.0, "n": 2.0, "temperature": 1.0}
    request = CompletionRequest.model_validate(body)
    assert (request.max_tokens, request.n) == (16, 2) and type(request.max_tokens) is int
    for refused in ({"max_tokens": 16.5}, {"max_tokens": "16"}, {"n": 1e300}):
        with pytest.raises(ValidationError):
            CompletionRequest.model_validate({**body, **refused})


PREFIX = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "A", "prefix": True}]


@pytest.mark.parametrize(
    ("model", "body", "where"),
    [
        (CompletionRequest, {**COMPLETION, "prompt": ["a"] * 17, "n": 2}, ("n",)),
        (
            ChatCompletionRequest,
            {**CHAT, "messages": PREFIX, "response_format": {"type": "json_object"}},
            ("messages", 1, "prefix"),
        ),
        (TokenizeRequest, {"model": "m"}, ("prompt",)),
    ],
)
def test_a_check_across_fields_names_the_field_it_refuses(model, body, where):
    """The error body's ``param`` is the refusal's location: these three were 400s with param null."""
    assert _refusal(model, body)["loc"] == where


IMAGE = {"type": "image_url", "image_url": {"url": "data:,", "detail": "x" * 17}}


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({**CHAT, "metadata": {f"k{i}": "v" for i in range(17)}}, ("metadata",)),  # OpenAI's 16 pairs
        ({**CHAT, "metadata": {"k" * 65: "v"}}, ("metadata", "k" * 65, "[key]")),  # keys of 64 characters
        ({**CHAT, "metadata": {"k": "v" * 513}}, ("metadata", "k")),  # values of 512
        ({**CHAT, "metadata": {"k": 1}}, ("metadata", "k")),  # strings
        ({**CHAT, "user": "u" * 257}, ("user",)),
        (
            {**CHAT, "messages": [{"role": "user", "content": [IMAGE]}]},
            ("image_url", "detail"),
        ),
        (
            {
                **CHAT,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "n", "description": "d" * (1 << 20 | 1)},
                },
            },
            ("response_format", "json_schema", "description"),
        ),
    ],
)
def test_fields_once_bounded_by_the_body_alone_have_bounds_of_their_own(body, where):
    with pytest.raises(ValidationError) as refused:
        ChatCompletionRequest.model_validate(body)
    assert where in [e["loc"][-len(where) :] for e in refused.value.errors()], refused.value.errors()


def test_fields_within_their_bounds_pass():
    metadata = {"k" * 64: "v" * 512} | {f"k{i}": "v" for i in range(15)}
    image = {"type": "image_url", "image_url": {"url": "data:,", "detail": "high"}}
    body = {**CHAT, "metadata": metadata, "user": "u" * 256, "messages": [{"role": "user", "content": [image]}]}
    assert ChatCompletionRequest.model_validate(body).metadata == metadata
    assert CompletionRequest.model_validate({**COMPLETION, "user": "u" * 256}).user == "u" * 256


def _history_call(name: str, arguments: str) -> dict:
    call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}
    answered = [{"role": "assistant", "tool_calls": [call]}, {"role": "tool", "tool_call_id": "c1", "content": "r"}]
    return {**CHAT, "messages": [*CHAT["messages"], *answered]}


@pytest.mark.parametrize(
    ("name", "arguments", "where"),
    [
        ('get">x', "{}", ("name",)),  # closed the invoke tag's name early
        ("a<b", "{}", ("name",)),
        ("f", '{"k\\">": 1}', ("arguments",)),  # an argument key closing its parameter tag
        ("f", '{"<k": 1}', ("arguments",)),
    ],
)
def test_a_history_call_the_call_format_cannot_write_is_refused(name, arguments, where):
    """V4's calls name functions and arguments inside quotes with no escape: these were accepted and
    rendered into the prompt as markup the model's calls never have."""
    with pytest.raises(ValidationError) as refused:
        ChatCompletionRequest.model_validate(_history_call(name, arguments))
    assert where in [e["loc"][-len(where) :] for e in refused.value.errors()], refused.value.errors()


@pytest.mark.parametrize(
    ("name", "arguments"),
    [("", "{}"), ("ns:tool.v2", '{"a b": 1, "é": "x"}'), ("f", "not json"), ("f", "[1, 2]"), ("f", '"s"')],
)
def test_history_calls_the_reply_parser_can_produce_pass(name, arguments):
    """Names and keys holding neither a quote nor a ``<`` are what chat/dsml.py reads from replies
    (an empty name included); arguments that are no JSON object render as one parameter."""
    body = ChatCompletionRequest.model_validate(_history_call(name, arguments))
    assert body.messages[-2].tool_calls[0].function.name == name


@pytest.mark.parametrize(("field", "limit"), [("logit_bias", 300), ("metadata", 16)])
def test_a_map_over_its_bound_is_refused_before_its_items_are_validated(field, limit):
    """As a list over its bound is: it was told "Dictionary should have at most 300 items after
    validation, not more" (no count), or an item's fault first (pydantic stops at the bound: its cost
    was bounded already)."""
    items = {f"k{i}": ["not a value"] for i in range(limit + 1)}  # every key and value wrong
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], field: items}
    with pytest.raises(ValidationError) as refused:
        ChatCompletionRequest.model_validate(body)
    errors = [(e["loc"], e["msg"]) for e in refused.value.errors()]
    assert errors == [((field,), f"at most {limit} properties, not {limit + 1}")]  # (in OpenAI's words)


@pytest.mark.parametrize(
    "key", ["5.0", " 5", "5 ", "+5", "05", "00", "5_0", "-5", "-0", "0x5", "\u0665", "1e1", "five"]
)
def test_a_logit_bias_key_that_is_not_a_token_id_in_decimal_is_refused_by_name(key):
    """OpenAI's keys are token ids as strings ("Invalid key in 'logit_bias': ..." otherwise):
    "5.0", " 5", "+5" and "05" were read as token 5, "5_0" as 50, and "5" beside "05" was one key."""
    error = _refusal(CompletionRequest, {**COMPLETION, "logit_bias": {key: 1}})
    why = f"invalid key {key!r}: a token id is a non-negative integer in decimal, such as '5'"
    assert (error["loc"], error["msg"]) == (("logit_bias", key, "[key]"), f"Value error, {why}")


def test_logit_bias_keys_in_decimal_are_token_ids():
    body = CompletionRequest.model_validate({**COMPLETION, "logit_bias": {"0": -1, "5": 2, "102400": 100}})
    assert body.logit_bias == {0: -1.0, 5: 2.0, 102400: 100.0}


PATTERN = "string_pattern_mismatch"


@pytest.mark.parametrize(
    ("name", "kind"),
    [(None, "missing"), *[(name, PATTERN) for name in ("", "a b", "a.b", "x" * 65)], ("A_2-" + "x" * 60, None)],
)
def test_a_json_schema_format_needs_a_name_as_openai_spells_one(name, kind):
    """OpenAI requires ``json_schema.name`` (a-z, A-Z, 0-9, _ and -, at most 64): one without was accepted."""
    named = {"schema": {"type": "object"}} | ({} if name is None else {"name": name})
    body = {**CHAT, "response_format": {"type": "json_schema", "json_schema": named}}
    if kind is None:
        assert ChatCompletionRequest.model_validate(body).response_format.json_schema.name == name
    else:
        error = _refusal(ChatCompletionRequest, body)
        assert error["loc"] == ("response_format", "json_schema", "name") and error["type"] == kind
