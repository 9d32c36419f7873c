"""The gateway refuses a schema too big to compile (400 naming its field, the limit and the setting
that raises it) before llguidance compiles it, and accepts realistic large ones (the gateway
in-process, on a real Redis: a refused request never queues, so no worker is needed)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from dayzero.params import Grammar
from dayzero.settings import Settings
from services.gateway.app import make_app
from services.gateway.chat import check_tool_set, grammar
from services.gateway.chat_schemas import ChatCompletionRequest
from services.gateway.errors import APIError

from .conftest import MODEL, chat

TYPES = ("integer", "string", "number", "boolean")


def _object(properties: int, prefix: str = "p") -> dict:
    return {"type": "object", "properties": {f"{prefix}{j}": {"type": TYPES[j % 4]} for j in range(properties)}}


def _formatted(schema: dict) -> dict:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}


def _tools(*parameters: dict) -> list[dict]:
    return [{"type": "function", "function": {"name": f"f{i}", "parameters": p}} for i, p in enumerate(parameters)]


def _referred(refs: int, properties: int, sibling: dict | None = None) -> dict:
    """An object of ``refs`` properties, each a $ref (with ``sibling`` beside it) to a definition of
    ``properties``."""
    referring = {f"r{i}": {"$ref": "#/$defs/d", **(sibling or {})} for i in range(refs)}
    return {"type": "object", "properties": referring, "$defs": {"d": _object(properties)}}


@pytest.fixture(scope="module")
def gateway(demo_dir, redis_url):
    with TestClient(make_app(Settings(checkpoint=demo_dir, redis_url=redis_url))) as client:
        yield client


@pytest.fixture(scope="module")
def small_limits(demo_dir, redis_url):
    """Limits lowered: schemas under the defaults' reach them (a request accepted would wait for a
    worker this module lacks: 503 after a second, not a 400)."""
    settings = Settings(
        checkpoint=demo_dir,
        redis_url=redis_url,
        guided_max_schema_nodes=50,
        guided_max_literal_chars=500,
        guided_max_pattern_chars=100,
        max_tools=3,
        no_worker_timeout_s=1,
    )
    with TestClient(make_app(settings)) as client:
        yield client


def _refused(client, body: dict, path: str = "/v1/chat/completions") -> dict:
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "too big: more than " in error["message"]  # a forced tool's: "the tools are too big: ..."
    unenforceable = error["message"].startswith("cannot enforce this schema")
    assert error["code"] == ("unsupported_schema" if unenforceable else "context_length_exceeded"), error  # (was null)
    return error


def test_a_schema_of_8000_properties_is_refused_by_its_size_under_the_default_limits(gateway):
    """It compiled for seconds (26 s under load) before llguidance's lexer limit refused it."""
    error = _refused(gateway, chat("hi", **_formatted(_object(8000))))
    assert error["param"] == "response_format"
    assert error["message"].endswith("at most DAYZERO_GUIDED_MAX_SCHEMA_NODES=3000 can be enforced")
    error = _refused(gateway, chat("hi", tools=_tools(_object(8000)), tool_choice="required"))
    assert error["param"] == "tools"
    completion = {"model": MODEL, "prompt": "hi", **_formatted(_object(8000))}
    error = _refused(gateway, completion, "/v1/completions")
    assert error["param"] == "response_format"


@pytest.mark.parametrize(
    ("extra", "param", "setting"),
    [
        (_formatted(_object(60)), "response_format", "DAYZERO_GUIDED_MAX_SCHEMA_NODES=50"),
        (_formatted({"enum": ["a" * 300, "b" * 300]}), "response_format", "DAYZERO_GUIDED_MAX_LITERAL_CHARS=500"),
        (_formatted({"type": "string", "pattern": "^" + "a" * 200 + "$"}), "response_format", "PATTERN_CHARS=100"),
        # two tools of 30 properties: under the limit each, past it together (one grammar enforces both)
        ({"tools": _tools(_object(30), _object(30)), "tool_choice": "required"}, "tools", "SCHEMA_NODES=50"),
        # 10 $refs with a sibling keyword to a definition of 10: 23 subschemas as written, 10 copies merged
        (_formatted(_referred(10, 10, {"type": "object"})), "response_format", "SCHEMA_NODES=50"),
        # a tool's 10 properties referring to a definition of 10: each property's rule compiles a copy
        ({"tools": _tools(_referred(10, 10)), "tool_choice": "required"}, "tools", "SCHEMA_NODES=50"),
    ],
)
def test_a_schema_past_a_lowered_limit_is_refused_naming_the_limit(small_limits, extra, param, setting):
    error = _refused(small_limits, chat("hi", **extra))
    assert error["param"] == param and setting in error["message"], error


def test_only_the_enforced_tools_count(small_limits):
    """tool_choice naming one tool: only its parameters make the grammar (the others are offered)."""
    named = {"type": "function", "function": {"name": "f0"}}
    body = ChatCompletionRequest(**chat("hi", tools=_tools(_object(30), _object(30)), tool_choice=named))
    assert isinstance(grammar(small_limits.app.state.gateway, body), Grammar)


def _realistic() -> dict:
    """300 properties, nested: 20 sections of 12 fields (descriptions, enums, arrays of records),
    a shared $defs record referenced from each section, 40 top-level fields."""
    record = {
        "type": "object",
        "properties": {"id": {"type": "string"}, "at": {"type": "string", "format": "date-time"}},
        "required": ["id"],
    }
    fields = {f"f{k}": {"type": TYPES[k % 4], "description": f"field {k} of the section"} for k in range(10)} | {
        "status": {"type": "string", "enum": ["draft", "open", "closed", "archived"]},
        "history": {"type": "array", "items": {"$ref": "#/$defs/record"}, "maxItems": 5},
    }
    sections = {f"s{i}": {"type": "object", "properties": fields, "required": ["status"]} for i in range(20)}
    top = {f"t{k}": {"type": TYPES[k % 4]} for k in range(40)}
    return {
        "type": "object",
        "properties": sections | top,
        "required": ["s0", "t0"],
        "$defs": {"record": record},
    }


def test_a_realistic_large_schema_and_tool_set_are_accepted_under_the_default_limits(gateway):
    """(The gateway's grammar step itself: accepted, the request would wait for a worker.)"""
    gw = gateway.app.state.gateway
    body = ChatCompletionRequest(**chat("hi", **_formatted(_realistic())))
    assert isinstance(grammar(gw, body), Grammar)
    tools = [  # 60 tools of 6 parameters: 360 properties, all enforced
        {"type": "function", "function": {"name": f"tool_{i}", "description": "a tool", "parameters": _object(6)}}
        for i in range(60)
    ]
    body = ChatCompletionRequest(**chat("hi", tools=tools, tool_choice="required"))
    assert isinstance(grammar(gw, body), Grammar)
    # a tool whose 40 properties refer to a shared definition (each rule compiles its own copy)
    body = ChatCompletionRequest(**chat("hi", tools=_tools(_referred(40, 12)), tool_choice="required"))
    assert isinstance(grammar(gw, body), Grammar)


@pytest.fixture(scope="module")
def short_context(demo_dir, redis_url):
    """A context of 100 tokens: a tool set of more subschemas than that can never be shown."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, max_context=100, no_worker_timeout_s=1)
    with TestClient(make_app(settings)) as client:
        yield client


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
@pytest.mark.parametrize("choice", ["auto", "required"])
def test_the_offered_tools_are_bounded_by_the_context_before_the_prompt_is_rendered(short_context, choice, path):
    """Under tool_choice auto a tool set of 8,000 properties was rendered into the prompt (130-450 ms)
    before the prompt's length refused it: more subschemas than the context's tokens (each renders to
    one at least) are refused first, whatever the tool_choice shows the model."""
    body = {**chat("hi", tools=_tools(_object(60), _object(40))), "tool_choice": choice}
    r = short_context.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "tools" and "more than 100 subschemas" in error["message"], error
    assert error["code"] == "context_length_exceeded", error  # (was null)


def test_offered_tools_are_not_held_to_the_compile_limits(small_limits, short_context):
    """Under auto the model only reads the tools: a set past DAYZERO_GUIDED_MAX_SCHEMA_NODES (50 here)
    but within the context is rendered (DAYZERO_MAX_TOOLS=128 tools of 24 properties each: 3,200
    subschemas, past the default limit of 3,000, were refused); under none they are not shown at all."""
    check_tool_set(small_limits.app.state.gateway, ChatCompletionRequest(**chat("hi", tools=_tools(_object(60)))))
    gw = short_context.app.state.gateway
    none = {**chat("hi", tools=_tools(_object(60), _object(40))), "tool_choice": "none"}
    check_tool_set(gw, ChatCompletionRequest(**none))
    check_tool_set(gw, ChatCompletionRequest(**chat("hi", tools=_tools(_object(50), _object(48)))))  # 100 nodes


def test_at_most_max_tools_are_offered(small_limits):
    gw = small_limits.app.state.gateway
    check_tool_set(gw, ChatCompletionRequest(**chat("hi", tools=_tools(*[_object(1)] * 3), tool_choice="auto")))
    r = small_limits.post("/v1/chat/completions", json=chat("hi", tools=_tools(*[_object(1)] * 4)))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "tools")
    assert error["message"] == "4 tools: at most DAYZERO_MAX_TOOLS=3 can be offered"


def test_openais_128_tools_with_a_realistic_schema_each_are_offered_under_the_default_limits(gateway):
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "parameters": _object(6)}} for i in range(129)]
    check_tool_set(gateway.app.state.gateway, ChatCompletionRequest(**chat("hi", tools=tools[:128])))
    r = gateway.post("/v1/chat/completions", json=chat("hi", tools=tools, max_tokens=1))
    assert r.status_code == 400 and "DAYZERO_MAX_TOOLS=128" in r.json()["error"]["message"], r.text


def test_an_object_of_hundreds_of_pattern_properties_is_refused_before_its_compile(gateway):
    """400 short patterns (2,000 characters, within DAYZERO_GUIDED_MAX_PATTERN_CHARS) compiled for
    25-63 s in the gateway (llguidance's compile grows steeply in an object's patterns)."""
    named = {f"^q{j}$": {"type": "integer"} for j in range(400)}
    r = gateway.post(
        "/v1/chat/completions", json=chat("hi", **_formatted({"type": "object", "patternProperties": named}))
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "response_format"), error
    assert error["message"].endswith("an object of 400 patternProperties: at most 100 in one can be enforced")


def test_an_object_past_the_parsers_row_is_refused_before_its_compile(gateway):
    """One required property, then 1,000 optional ones: the gateway's check (its first steps) let it
    through, and every reply writing the properties failed mid-way (llguidance's row limit)."""
    body = ChatCompletionRequest(**chat("hi", **_formatted({**_object(1001), "required": ["p0"]})))
    with pytest.raises(APIError) as refused:
        grammar(gateway.app.state.gateway, body)
    assert refused.value.status == 400 and refused.value.param == "response_format"
    assert "an object of 1,000 optional properties declared after a required one in a row: at most 998" in (
        refused.value.message
    )


def test_a_union_of_referred_objects_past_the_parsers_row_is_refused_before_it_queues(short_context):
    """Its branches' $refs were not followed: the gateway took it (its check's first steps end before a
    reply reaches the union) and llguidance failed the reply there, a 500 "sampling failed" after the
    prompt's prefill (a stream: 200, the first tokens, then the error)."""
    union = {"anyOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}]}
    flags = {f"b{i}": {"type": "boolean"} for i in range(4)}
    schema = {
        "type": "object",
        "properties": flags | {"u": union},
        "required": [*flags, "u"],
        "$defs": {"a": _object(249, "a"), "b": _object(249, "b")},
    }
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 50, **_formatted(schema)}
    r = short_context.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "response_format", error
    assert "the objects of one anyOf / oneOf hold 498 optional properties" in error["message"], error


def test_a_forced_tool_whose_string_parameter_has_thousands_of_values_is_enforced(short_context):
    """Each value was an item of llguidance's parser row: from 2,000 values every such call was refused
    ("Current row has 2001 items"), 17,000-19,000 only after 2-4 s of compile; an enum within the
    literal limit is one lexeme now (as a JSON enum), and the gateway's grammar step takes it."""
    values = [f"v{i}" for i in range(2000)]
    parameters = {"type": "object", "properties": {"k": {"type": "string", "enum": values}}, "required": ["k"]}
    body = ChatCompletionRequest(**chat("hi", tools=_tools(parameters), tool_choice="required"))
    assert isinstance(grammar(short_context.app.state.gateway, body), Grammar)


@pytest.mark.parametrize("merging", ["allOf", "$ref with siblings"])
def test_a_union_of_merged_objects_past_the_parsers_row_is_refused_before_it_queues(short_context, merging):
    """Each branch an allOf of two objects of 200 optional properties, or a $ref to one beside the
    other's properties: llguidance merges them (400 each, 3,214 items of a row), the count saw 400
    in all (1,614 items), and every reply failed as it reached the union (its first steps pass)."""

    def branch(i: int) -> dict:
        second = _object(200, f"y{i}_")
        if merging == "allOf":
            return {"allOf": [_object(200, f"x{i}_"), second]}
        return {"$ref": f"#/$defs/d{i}", "properties": second["properties"]}

    flags = {f"b{i}": {"type": "boolean"} for i in range(4)}
    schema = {
        "type": "object",
        "properties": flags | {"u": {"anyOf": [branch(0), branch(1)]}},
        "required": [*flags, "u"],
        "$defs": {f"d{i}": _object(200, f"x{i}_") for i in range(2)},
    }
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 50, **_formatted(schema)}
    r = short_context.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "response_format"), error
    assert "the objects of one anyOf / oneOf hold 800 optional properties" in error["message"], error


def test_a_ref_the_merge_cannot_resolve_is_a_400_not_a_500(gateway):
    """A JSON pointer's index in digits other than ASCII ones ("²" is a digit to Python, not to int)
    raised from the merge of an allOf's $ref: the gateway answered 500."""
    schema = {"allOf": [{"type": "object"}, {"$ref": "#/allOf/²"}]}
    r = gateway.post("/v1/chat/completions", json=chat("hi", **_formatted(schema)))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "response_format"


def test_a_forced_tool_keeps_the_definitions_referred_to_under_a_property_named_default(gateway):
    """A value's rule carries the definitions its $refs reach: those under a property named
    "default" (or "enum", "const", "examples") were taken for data and dropped, and the tool,
    enforced before, was refused ("Pointer '/$defs/Profile' does not exist")."""
    profile = {"type": "object", "properties": {"level": {"type": "integer"}}}
    config = {"type": "object", "properties": {"default": {"$ref": "#/$defs/Profile"}, "name": {"type": "string"}}}
    parameters = {"type": "object", "properties": {"config": config}, "$defs": {"Profile": profile}}
    body = ChatCompletionRequest(**chat("hi", tools=_tools(parameters), tool_choice="required"))
    assert isinstance(grammar(gateway.app.state.gateway, body), Grammar)
