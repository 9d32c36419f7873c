"""A chat's tool calls as the gateway shapes them (in-process, no stack): streamed chunks add up to
the body for every cut, and finish_reason is "tool_calls" exactly when calls with JSON arguments are
reported, also when the model ends its reply inside a call."""

from __future__ import annotations

import json
import time

import pytest

from dayzero.chat.auto_grammar import auto_calls_grammar
from dayzero.chat.grammar import tool_calls_grammar
from dayzero.params import Grammar, SamplingParams
from dayzero.serving.messages import GenerationRequest
from dayzero.serving.records import Token
from services.gateway.shapes import Shape

D = "｜DSML｜"
OPEN_CALL = f'Sure.\n\n<{D}tool_calls>\n<{D}invoke name="a">\n<{D}parameter name="x" string="false">1</{D}parameter>\n'


class _Codec:
    has_tokenizer = True


def _shape() -> Shape:
    request = GenerationRequest(
        request_id="r" * 20, kind="chat", prompt_ids=(1,), sampling=SamplingParams(max_tokens=9),
        created=time.time(), tool_calls=True,
    )  # fmt: skip
    return Shape(request, "m", _Codec())


def _body(text: str, finish: str) -> tuple:
    choice = _shape().body(text, finish, {}, [])["choices"][0]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in choice["message"].get("tool_calls", [])]
    return choice["message"]["content"] or "", calls, choice["finish_reason"]


def _stream(text: str, cut: int, finish: str) -> tuple:
    shape, content, calls, reason = _shape(), "", {}, None
    for chunk in (shape.chunk(text[:cut], None), shape.chunk(text[cut:], finish)):
        if chunk is None:
            continue
        delta = chunk["choices"][0]["delta"]
        content += delta.get("content") or ""
        for call in delta.get("tool_calls", []):
            entry = calls.setdefault(call["index"], ["", ""])
            entry[0] += call["function"].get("name", "")
            entry[1] += call["function"].get("arguments", "")
        reason = chunk["choices"][0]["finish_reason"] or reason
    return content, [tuple(calls[k]) for k in sorted(calls)], reason


@pytest.mark.parametrize(
    ("finish", "expected"),
    [
        ("stop", ("Sure.", [("a", '{"x": 1}')], "tool_calls")),  # the model's EOS ends the call it left open
        ("length", ("Sure.", [("a", "")], "length")),  # a call cut by max_tokens: id and name only
    ],
)
def test_a_reply_ended_inside_a_call(finish, expected):
    assert _body(OPEN_CALL, finish) == expected
    for cut in range(len(OPEN_CALL) + 1):
        assert _stream(OPEN_CALL, cut, finish) == expected, cut
    if finish == "stop":
        assert json.loads(expected[1][0][1]) == {"x": 1}


@pytest.mark.parametrize(("choice", "held"), [("required", True), ("auto", False)])
def test_a_forced_call_cut_in_its_opening_is_no_content_read_back_from_the_record_too(choice, held):
    """A stream resumed (Last-Event-ID) is shaped from the request's record, the JSON on the wire: a
    forced call's request read back was an "auto" one, and its cut opening "\\n\\n<" came back as
    content where the stream it resumes dropped it."""
    tools = [{"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}}]
    lark = tool_calls_grammar(tools, '"D"') if choice == "required" else auto_calls_grammar(tools, '"D"')
    request = GenerationRequest(
        request_id="r" * 20, kind="chat", prompt_ids=(1,), sampling=SamplingParams(max_tokens=2, grammar=Grammar(lark)),
        created=time.time(), tool_calls=True,
    )  # fmt: skip
    record = GenerationRequest.model_validate_json(request.model_dump_json())
    for admitted in (request, record):
        shape = Shape(admitted, "m", _Codec())
        shape.replay(Token(request_id="r" * 20, index=0, token=0, text="\n\n"))
        chunk = shape.chunk("<", "length")
        assert chunk["choices"][0]["delta"].get("content", "") == ("" if held else "\n\n<"), chunk
