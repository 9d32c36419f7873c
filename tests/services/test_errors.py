"""OpenAI-style error bodies: the shape, nothing of the process's memory in the message, and a
message that says what to change (the gateway in-process, on a real Redis: every request here
is refused before it queues, so no worker is needed)."""

from __future__ import annotations

import base64
import json
import re

import pytest
import redis
from fastapi.testclient import TestClient

from dayzero.settings import Settings
from services.gateway.app import make_app
from services.gateway.errors import error_body

from .conftest import MODEL, chat
from .test_decode_appends import writes_refused


@pytest.fixture(scope="module")
def gateway(demo_dir, redis_url):
    with TestClient(make_app(Settings(checkpoint=demo_dir, redis_url=redis_url))) as client:
        yield client


def test_error_bodies_have_openai_shape_and_no_memory_addresses():
    body = error_body("bad value <services.gateway.schemas.Message object at 0x7f3a2b1c9d10>", "invalid_request_error")
    assert body == {
        "error": {
            "message": "bad value <services.gateway.schemas.Message>",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }


def _error(gateway, body: dict, **kw) -> dict:
    r = gateway.post("/v1/chat/completions", json=body, **kw)
    assert r.status_code == 400, r.text
    return r.json()["error"]


def test_a_json_body_under_another_content_type_is_told_to_use_application_json(gateway):
    for sent in ("text/plain", "application/x-www-form-urlencoded"):
        r = gateway.post("/v1/chat/completions", content=json.dumps(chat("hi")), headers={"content-type": sent})
        assert r.status_code == 400
        message = r.json()["error"]["message"]
        assert message == f"the body must be JSON sent with content-type: application/json (got {sent})"


def test_a_non_finite_number_is_refused_as_such(gateway):
    body = json.dumps(chat("hi", temperature=float("nan")))  # NaN: a JSON extension Python reads and writes
    r = gateway.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "temperature: Input should be a finite number"


def test_an_unreadable_image_is_refused_without_internal_names(gateway):
    url = "data:image/png;base64," + base64.b64encode(b"plain text, not a picture").decode()
    content = [{"type": "image_url", "image_url": {"url": url}}]
    error = _error(gateway, {"model": MODEL, "messages": [{"role": "user", "content": content}]})
    assert error["code"] == "invalid_image" and error["param"] == "messages[0].content[0].image_url.url"
    assert error["message"].startswith("not a readable image") and "<" not in error["message"], error


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}},
                    },
                }
            },
            "response_format",
        ),
        (
            {
                "tools": [{"type": "function", "function": {"name": "a", "parameters": {"type": "objectx"}}}],
                "tool_choice": "required",
            },
            "tools[0].function.parameters",
        ),
    ],
)
def test_a_schema_that_cannot_be_enforced_is_refused_in_short(gateway, extra, param):
    error = _error(gateway, chat("hi", **extra))
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert "cannot enforce" in error["message"] and "%json" not in error["message"] and "\n" not in error["message"]


def _tool(i: int, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": f"f{i}", "parameters": parameters}}


def test_a_forced_tool_with_no_finite_value_is_refused_among_many(gateway):
    """A required property whose $ref is its own object, behind 12 required booleans (~170 bytes
    in): one forced tool is walked 256 bytes and its walk finds it; 128 are walked 64 bytes each
    (their CPU), and the 128th was let through to fail every reply there. Now found in the schema
    (``schema_endless``), however many are forced."""
    node = {"$ref": "#/$defs/node"}
    late = {"type": "object", "properties": {f"b{i}": {"type": "boolean"} for i in range(12)} | {"s": node}}
    late |= {"required": [*late["properties"]], "$defs": {"node": {"type": "object", "properties": {"c": node}}}}
    late["$defs"]["node"]["required"] = ["c"]
    error = _error(gateway, chat("hi", tools=[_tool(0, late)], tool_choice="required"))
    assert error["param"] == "tools[0].function.parameters" and "Too many items" in error["message"], error
    many = [_tool(i, {"type": "object", "properties": {"a": {"type": "integer"}}}) for i in range(127)]
    error = _error(gateway, chat("hi", tools=[*many, _tool(127, late)], tool_choice="required"))
    assert error["param"] == "tools[127].function.parameters", error
    assert "no finite value satisfies it" in error["message"], error


@pytest.mark.parametrize("mark", ['"', "<"])
@pytest.mark.parametrize("choice", ["auto", "required"])
def test_a_tool_parameter_name_the_call_format_cannot_carry_is_refused(gateway, choice, mark):
    """V4 writes ``parameter name="KEY"`` unescaped: a quote in KEY would lose its value, and the
    reply parser reads no name holding a ``<`` (a forced call's required ``a<b`` came back ``{}``)."""
    key = f"a{mark}b"
    parameters = {"type": "object", "properties": {key: {"type": "string"}}, "required": [key]}
    tools = [{"type": "function", "function": {"name": "f", "parameters": parameters}}]
    error = _error(gateway, chat("hi", tools=tools, tool_choice=choice))
    assert error["param"] == "tools[0].function.parameters"
    why = f"the model's tool calls cannot carry a {mark!r} in a name"
    assert error["message"] == f"tools[0].function.parameters: parameter name {key!r}: {why}"


def test_an_empty_list_of_content_parts_is_refused(gateway):
    error = _error(gateway, {"model": MODEL, "messages": [{"role": "user", "content": []}]})
    assert error["param"] == "messages[0].content" and "at least 1 item" in error["message"], error


def test_a_string_parameter_constraint_a_forced_call_cannot_keep_is_refused(gateway):
    """V4 writes a string argument as raw text: a ``pattern`` (or ``format``) on it cannot be enforced
    there, and was dropped silently; an enum whose every value holds "<" allowed only "". (The
    gateway's grammar step itself: accepted, the request would wait for a worker this one lacks.)"""
    from services.gateway.chat import grammar
    from services.gateway.chat_schemas import ChatCompletionRequest
    from services.gateway.errors import APIError

    for prop in ({"type": "string", "pattern": "^[a-z]+$"}, {"type": "string", "enum": ["<a>", "<b>"]}):
        parameters = {"type": "object", "properties": {"k": prop}, "required": ["k"]}
        tools = [{"type": "function", "function": {"name": "f", "parameters": parameters}}]
        body = ChatCompletionRequest(**chat("hi", tools=tools, tool_choice="required"))
        with pytest.raises(APIError) as refused:
            grammar(gateway.app.state.gateway, body)
        assert refused.value.status == 400 and refused.value.param == "tools"
        assert refused.value.message.startswith("cannot enforce this schema: ")


def test_a_method_a_route_does_not_take_is_answered_with_allow(gateway):
    r = gateway.put("/v1/chat/completions", json={})
    assert r.status_code == 405 and r.headers["allow"] == "POST", r.headers
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_an_unexpected_failure_is_a_counted_500_that_keeps_the_connection(caplog):
    """The last resort answers in OpenAI's shape and does not re-raise (re-raised, uvicorn closed the
    keep-alive connection under the client's next request, and the 500 was never counted); its log
    line names what was asked."""
    from fastapi import FastAPI

    from services.gateway import errors
    from services.gateway.metrics import CountResponses, GatewayMetrics

    app = FastAPI()
    errors.install(app)
    app.add_middleware(errors.CatchAll)
    app.add_middleware(CountResponses)
    app.state.gateway = type("Gateway", (), {"metrics": GatewayMetrics()})()

    @app.get("/v1/boom")
    async def boom():
        raise RuntimeError("boom at 0x7f00")

    with TestClient(app) as client:  # raises what the app re-raises
        r = client.get("/v1/boom")
    assert r.status_code == 500 and r.json()["error"] == {
        "message": "internal error",
        "type": "server_error",
        "param": None,
        "code": None,
    }
    assert app.state.gateway.metrics.responses.labels("500")._value.get() == 1
    assert "internal error answering GET /v1/boom" in caplog.text and "boom at 0x7f00" in caplog.text


def test_the_openapi_document_says_what_the_gateway_answers(gateway):
    """400 with OpenAI's error body where FastAPI documents a 422 it never sends; 404 for a path's id,
    and for a body's model this server does not serve."""
    schema = gateway.get("/openapi.json").json()
    assert '"422"' not in json.dumps(schema) and "HTTPValidationError" not in schema["components"]["schemas"]
    refused = schema["paths"]["/v1/chat/completions"]["post"]["responses"]["400"]
    assert refused["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
    assert schema["components"]["schemas"]["Error"]["properties"]["error"]["required"] == [
        "message",
        "type",
        "param",
        "code",
    ]
    assert "404" in schema["paths"]["/v1/requests/{request_id}/stream"]["get"]["responses"]
    for path in ("/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"):  # a model not served
        assert "404" in schema["paths"][path]["post"]["responses"], path


def test_a_request_redis_cannot_queue_is_a_503_with_the_code_its_stream_would_end_with(gateway, redis_url):
    """Redis refusing the admission's writes (at its memory limit) or unreachable: 503 with Retry-After
    and ``queue_unavailable``, as a stream Redis fails ends (the code was null at admission)."""
    with writes_refused(redis.Redis.from_url(redis_url)):
        answer = gateway.post("/v1/chat/completions", json=chat("hello", max_tokens=2))
    assert (answer.status_code, answer.headers.get("retry-after")) == (503, "1")
    assert answer.json()["error"] == {
        "message": "the request queue is unavailable; retry shortly",
        "type": "service_unavailable",
        "param": None,
        "code": "queue_unavailable",
    }


@pytest.mark.parametrize(
    ("body", "what", "character", "byte"),
    [
        (b'{"model": "m", "prompt": "caf\xe9"}', "invalid continuation byte", 29, 29),
        (b'{"p": "\xc3\xa9", "x": "\xff"}', "invalid start byte", 17, 18),
        (b'{"model": "m", "prompt": "\xc3', "unexpected end of data", 26, 26),
        (b'{"p": "\xed\xa0\x80", "x": "\xff"}', "invalid start byte", 17, 19),
        (b'\xef\xbb\xbf{"p": "\xff"}', "invalid start byte", 7, 10),
    ],
    ids=["continuation", "start_after_two_bytes", "cut", "after_a_lone_surrogate", "after_a_bom"],
)
def test_a_body_that_is_not_utf8_is_told_what_and_where(gateway, body, what, character, byte):
    """It was "There was an error parsing the body", with no position (after a lone surrogate, which
    the parse takes, too: its position was looked for in strict UTF-8); after a byte order mark, the
    byte was 3 short (counted from the mark's end; the character is the parse's, which skips it)."""
    r = gateway.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    sequence = f"in the sequence that begins with byte 0x{body[byte]:02x}"
    expected = f"the body is not UTF-8: {what} {sequence} (at character {character}, byte {byte})"
    error = {"message": expected, "type": "invalid_request_error", "param": None, "code": "invalid_json"}
    assert r.json()["error"] == error


BEFORE_THE_NESTING = ["", '{"model": "m", "x": "[[[{{\ud800", "prompt": ']  # a lone surrogate's UTF-8: json takes it


@pytest.mark.parametrize("before", BEFORE_THE_NESTING, ids=["bare", "in_a_field"])
def test_json_nested_past_the_parser_is_told_how_deep_and_where(gateway, before):
    """Brackets inside strings do not count. It was "There was an error parsing the body"."""
    body = (before + "[" * 100_000).encode("utf-8", "surrogatepass")
    r = gateway.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    found = re.fullmatch(
        r"the body nests JSON deeper than this server parses \((\d+) levels; at character (\d+)\)", message
    )
    deepest = int(found[1]) - (1 if before else 0)  # the arrays' own (the field's object is a level)
    assert found and deepest > 500 and int(found[2]) == len(before) + deepest, message
    within = (before + "[" * deepest + "]" * deepest + ("}" if before else "")).encode("utf-8", "surrogatepass")
    r = gateway.post("/v1/completions", content=within, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "nests" not in r.text, r.text  # parsed: refused for its fields


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-16-le", "utf-32"])
def test_json_nested_past_the_parser_in_utf16_32_or_after_a_bom_is_told_where(gateway, encoding):
    """JSON in UTF-16 or -32 (RFC 8259's older encodings, which the parse reads) nested too deep: it was
    "There was an error parsing the body" (the position was looked for in the body read as UTF-8);
    after UTF-8's byte order mark, a character past it (the parse skips the mark)."""
    before = '{"model": "é", "prompt": '
    body = (before + "[" * 100_000).encode(encoding)
    r = gateway.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    found = re.fullmatch(
        r"the body nests JSON deeper than this server parses \((\d+) levels; at character (\d+)\)",
        r.json()["error"]["message"],
    )
    assert found and int(found[2]) == len(before) + int(found[1]) - 1, r.text
