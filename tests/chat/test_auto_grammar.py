"""tool_choice "auto" with a strict tool: free text and thought as without a grammar, each call
block held to the tools, a strict tool's arguments to its schema. Token sequences forced through
the real grammar on the demo tokenizer (V4's special tokens), each token checked against the mask."""

from __future__ import annotations

import json

import pytest

from dayzero.chat.auto_grammar import auto_calls_grammar
from dayzero.chat.grammar import dsml_symbol
from dayzero.chat.output import AssistantStream, parse_message
from dayzero.chat.tokens import DSML, END_THINK, LATEST_REMINDER, THINK, USER

ALLOWED = 200  # compute_logit_bias's byte for a token the grammar allows
WEATHER = {  # as openai.pydantic_function_tool writes one: strict, every property required
    "type": "function",
    "function": {
        "name": "weather",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"days": {"type": "integer"}, "city": {"type": "string"}},
            "required": ["days", "city"],
            "additionalProperties": False,
        },
    },
}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}  # not strict


def _call(name: str, *params: tuple[str, bool, str]) -> str:
    lines = [f'<{DSML}parameter name="{k}" string="{str(s).lower()}">{v}</{DSML}parameter>\n' for k, s, v in params]
    return f'<{DSML}invoke name="{name}">\n' + "".join(lines) + f"</{DSML}invoke>"


def _block(*calls: str) -> str:
    return f"\n\n<{DSML}tool_calls>\n" + "\n".join(calls) + f"\n</{DSML}tool_calls>"


GOOD = _call("weather", ("days", False, "3"), ("city", True, "Paris"))


class Walk:
    """A matcher of the auto grammar of ``tools`` over the demo tokenizer, fed whole texts."""

    def __init__(self, codec, tools: list[dict], parallel: bool = True) -> None:
        kept = tuple(f"<[{codec.token_id(t)}]>" for t in (THINK, END_THINK))
        lark = auto_calls_grammar(tools, dsml_symbol(codec.token_id(DSML), DSML), kept, parallel)
        self.codec, self.matcher = codec, codec.grammars.matcher(lark)
        self.eos = codec.token_id("<｜end▁of▁sentence｜>")
        assert not self.matcher.is_error(), self.matcher.get_error()

    def feed(self, text: str) -> str | None:
        """None when the grammar takes every token of ``text``, else the text up to the one it refuses."""
        ids = [t for t in self.codec.encode(text) if t != self.codec.token_id("<｜begin▁of▁sentence｜>")]
        for k, token in enumerate(ids):
            if self.matcher.compute_logit_bias()[token] != ALLOWED:
                return self.codec.decode_all(ids[:k])
            self.matcher.consume_token(token)
        return None

    def may_end(self) -> bool:
        return self.matcher.compute_logit_bias()[self.eos] == ALLOWED


@pytest.mark.parametrize(
    "text",
    [
        "Hello! a<b, <i>x</i> and 1 < 2 </think> <think> 'done'\n\n",
        "｜DSML and DSML｜ apart, <｜ alone, ｜ ｜",
        "",
        "The weather tool takes days (an integer).",
    ],
)
def test_a_text_reply_is_as_free_as_without_a_grammar(codec, text):
    walk = Walk(codec, [WEATHER, SEARCH])
    assert walk.feed(text) is None and walk.may_end()


def test_a_strict_call_is_written_and_read_back(codec):
    walk = Walk(codec, [WEATHER, SEARCH])
    text = "Let me look." + _block(GOOD) + "\n\nDone."
    assert walk.feed(text) is None and walk.may_end()
    reply = parse_message(text, thinking=False, stopped=True)
    assert reply.content == "Let me look.\n\nDone."
    assert [(c.name, json.loads(c.arguments)) for c in reply.calls] == [("weather", {"days": 3, "city": "Paris"})]


@pytest.mark.parametrize(
    ("call", "refused_after"),
    [
        (_call("weather", ("days", True, "three"), ("city", True, "x")), 'name="days" string="'),  # a str
        (_call("weather", ("days", False, '"3"'), ("city", True, "x")), 'name="days" string="false">'),
        (_call("weather", ("days", False, "3.5"), ("city", True, "x")), 'string="false">3'),
        (_call("weather", ("days", False, "3")), f"</{DSML}parameter>\n<"),  # city is required: no "</"
        (_call("weather", ("city", True, "x"), ("days", False, "3")), f'<{DSML}parameter name="'),  # its order
        (_call("forecast"), f'<{DSML}invoke name="'),  # no such tool
    ],
    ids=["days_as_text", "days_quoted", "days_float", "city_missing", "out_of_order", "unknown_tool"],
)
def test_a_strict_tool_s_wrong_call_cannot_be_written(codec, call, refused_after):
    walk = Walk(codec, [WEATHER, SEARCH])
    written = walk.feed("Sure." + _block(call))
    assert written is not None and written.endswith(refused_after), written


def test_a_tool_that_is_not_strict_takes_any_parameters(codec):
    walk = Walk(codec, [WEATHER, SEARCH])
    call = _call("search", ("q", True, "a</b> <x> 1 < 2"), ("limit", False, '"ten"'), ("days", False, "{"))
    text = _block(call, GOOD)
    assert walk.feed(text) is None and walk.may_end()
    names = [c.name for c in parse_message(text, thinking=False, stopped=True).calls]
    assert names == ["search", "weather"]


@pytest.mark.parametrize(
    "text",
    [
        f"a {DSML} b",  # a bare marker (the token)
        f'a\n\n<{DSML}invoke name="search">\n</{DSML}invoke>',  # calls without their block
        f"a {USER} b",  # a special token the text drops: the text around it would join
        f"a {LATEST_REMINDER}",
    ],
    ids=["bare_marker", "bare_invoke", "user_token", "reminder_token"],
)
def test_the_marker_opens_a_block_or_nothing(codec, text):
    assert Walk(codec, [WEATHER]).feed(text) is not None


def test_the_marker_spelled_in_pieces_is_refused(codec):
    """Byte tokens spelling ``｜DSML｜`` decode to the marker's text, which the reply parser reads as
    the token: they may not write it (a block the grammar never saw)."""
    walk = Walk(codec, [WEATHER])
    pieces = [t for part in ("x <", DSML[:-1], DSML[-1]) for t in codec.encode(part)[1:]]
    assert DSML not in "".join(codec.decode_all([t]) for t in pieces[:-1])
    for token in pieces[:-1]:
        walk.matcher.consume_token(token)
    assert walk.matcher.compute_logit_bias()[pieces[-1]] != ALLOWED


def test_the_thought_is_free_and_a_call_after_it_is_held(codec):
    walk = Walk(codec, [WEATHER])
    thought = "The user wants <weather>; days is an integer."
    text = thought + END_THINK + "Checking." + _block(GOOD)
    assert walk.feed(text) is None and walk.may_end()
    reply = parse_message(text, thinking=True, stopped=True)
    assert (reply.reasoning, reply.content, [c.name for c in reply.calls]) == (thought, "Checking.", ["weather"])
    bad = Walk(codec, [WEATHER]).feed(thought + _block(_call("weather", ("days", True, "x"))))  # ends the thought
    assert bad is not None and bad.endswith('string="')


@pytest.mark.parametrize("gap", ["", "\n", "\n\n"], ids=["no_blank_line", "newline", "blank_line"])
@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
def test_a_block_the_grammar_lets_the_thought_write_is_read_as_calls(codec, gap, stream):
    """The grammar holds a marker in the thought to a valid block wherever it opens; the parser read
    one as calls only after a blank line: the block written right after the thought's text (no
    blank line) stayed in reasoning_content, DSML and all, and its call was lost."""
    thought, block = "I need the weather." + gap, _block(GOOD).removeprefix("\n\n")
    text = thought + block
    assert Walk(codec, [WEATHER]).feed(text) is None
    if stream:  # a token at a time, as a stream's shape feeds it
        stream_parts = AssistantStream(thinking=True, tools=True)
        parts = [stream_parts.feed(codec.decode_all([t])) for t in codec.encode(text)[1:]]
        parts.append(stream_parts.finish(stopped=True))
        reasoning, calls = "".join(p.reasoning for p in parts), [c for p in parts for c in p.calls]
    else:
        reply = parse_message(text, thinking=True, stopped=True)
        reasoning, calls = reply.reasoning, reply.calls
    assert reasoning == thought.removesuffix("\n\n") and DSML not in reasoning, reasoning
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("weather", {"days": 3, "city": "Paris"})]


def test_one_call_when_parallel_calls_are_off(codec):
    assert Walk(codec, [WEATHER], parallel=False).feed(_block(GOOD, GOOD)) is not None
    walk = Walk(codec, [WEATHER], parallel=False)
    assert walk.feed(_block(GOOD) + "\n\nAnd " + _block(GOOD)) is not None
    walk = Walk(codec, [WEATHER], parallel=False)
    assert walk.feed("Here:" + _block(GOOD) + "\n\nthat's all") is None and walk.may_end()


def test_a_reply_cut_inside_a_block_may_not_end_there(codec):
    walk = Walk(codec, [WEATHER])
    assert walk.feed("x" + _block(GOOD)[:-5]) is None and not walk.may_end()
