"""DSML tool calls and thinking-mode reasoning parsed out of model text written by hand, also
when the text arrives in pieces split at every character or stops anywhere."""

from __future__ import annotations

import json

import pytest

from dayzero.chat.dsml import render_calls
from dayzero.chat.output import AssistantStream, parse_message

D = "｜DSML｜"
ANSWER = (
    "Let me check both.\n\n"
    f"<{D}tool_calls>\n"
    f'<{D}invoke name="get_weather">\n'
    f'<{D}parameter name="city" string="true">São Paulo</{D}parameter>\n'
    f'<{D}parameter name="days" string="false">3</{D}parameter>\n'
    f"</{D}invoke>\n"
    f'<{D}invoke name="search">\n'
    f'<{D}parameter name="query" string="true">a < b\nand "c"</{D}parameter>\n'
    f'<{D}parameter name="filters" string="false">{{"lang": ["en", "pt"], "safe": true}}</{D}parameter>\n'
    f"</{D}invoke>\n"
    f"</{D}tool_calls>"
)
CALLS = [
    ("get_weather", {"city": "São Paulo", "days": 3}),
    ("search", {"query": 'a < b\nand "c"', "filters": {"lang": ["en", "pt"], "safe": True}}),
]


def _calls(parts) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in parts.calls]


def _streamed(text: str, pieces: list[int], thinking: bool = False):
    stream, out = AssistantStream(thinking), []
    edges = [0, *pieces, len(text)]
    for a, b in zip(edges, edges[1:], strict=False):
        out.append(stream.feed(text[a:b]))
    out.append(stream.finish())
    whole = out[0]
    for delta in out[1:]:
        whole = whole.then(delta)
    return whole


def test_a_whole_answer():
    parts = parse_message(ANSWER, thinking=False)
    assert parts.content == "Let me check both." and parts.reasoning == ""
    assert _calls(parts) == CALLS and parts.started == ["get_weather", "search"]


@pytest.mark.parametrize("thinking", [False, True])
def test_split_at_every_character(thinking):
    text = ("I should call tools.</think>" if thinking else "") + ANSWER
    for cut in range(len(text) + 1):
        parts = _streamed(text, [cut], thinking)
        assert parts.content == "Let me check both.", cut
        assert parts.reasoning == ("I should call tools." if thinking else ""), cut
        assert _calls(parts) == CALLS, cut
    one_by_one = _streamed(text, list(range(1, len(text))), thinking)
    assert one_by_one.content == "Let me check both." and _calls(one_by_one) == CALLS


def test_a_stream_cut_anywhere_never_shows_dsml():
    for end in range(len(ANSWER) + 1):
        parts = _streamed(ANSWER[:end], list(range(1, end)))
        assert "｜" not in parts.content and "DSML" not in parts.content, end
        assert "Let me check both.\n\n<".startswith(parts.content), end  # cut before the marker: plain text
        assert _calls(parts) == CALLS[: len(parts.calls)], end  # only complete calls, each correct


@pytest.mark.parametrize("cut", ["\n", "\n\n", "\n\n<"])
def test_a_call_only_answer_cut_before_its_marker_has_no_content(cut):
    """Under tool_choice required or named a grammar lets the answer write only calls: the start of
    a block's opening cut by max_tokens is markup. It came back as content."""
    assert parse_message(cut, thinking=False, calls_only=True).content == ""
    stream = AssistantStream(False, calls_only=True)
    pieces = [stream.feed(character) for character in cut]
    assert [p.content for p in pieces] == [""] * len(cut) and stream.finish().content == ""
    assert parse_message(cut, thinking=False).content == cut  # else it may be text ("ends with <")


def test_text_that_only_looks_like_a_tag_start_is_content():
    assert parse_message("a < b and x <| y", thinking=False).content == "a < b and x <| y"
    assert parse_message("ends with <", thinking=False).content == "ends with <"
    assert parse_message("two\n\n", thinking=False).content == "two\n\n"


def test_stray_dsml_is_dropped_and_text_after_a_block_is_content():
    parts = parse_message(f"Hi <{D}invoke oops", thinking=False)
    assert parts.content == "Hi " and not parts.calls
    after = parse_message(f"A\n\n<{D}tool_calls>\n</{D}tool_calls>\nB", thinking=False)
    assert after.content == "A\n\nB" and not after.calls  # the block's blank line sets them apart


def test_reasoning_cut_before_its_end():
    parts = _streamed("still thinking </thi", [5, 17], thinking=True)
    assert parts.reasoning == "still thinking </thi" and parts.content == ""


def test_calls_render_back_as_they_were_parsed():
    calls = [
        {"id": "1", "type": "function", "function": {"name": n, "arguments": json.dumps(a, ensure_ascii=False)}}
        for n, a in CALLS
    ]
    assert render_calls(calls) == ANSWER.removeprefix("Let me check both.")


def test_two_blocks_in_one_piece_give_each_call_once():
    block = ANSWER.removeprefix("Let me check both.")
    parts = parse_message("One." + block + "Two." + block, thinking=False)
    assert parts.content == "One.\n\nTwo." and _calls(parts) == CALLS + CALLS and len(parts.started) == 4


def test_json_arguments_keep_the_text_the_model_wrote():
    """As DeepSeek's decoder: a string="false" value is passed on as written (re-serialised, 1e400
    became Infinity, not JSON, and digits past a double's were lost); NaN, not JSON, stays a string."""
    from dayzero.chat.dsml import parse_calls

    body = (
        f'<{D}invoke name="f">\n'
        f'<{D}parameter name="big" string="false">1e400</{D}parameter>\n'
        f'<{D}parameter name="exact" string="false">0.1000000000000000055511151231257827</{D}parameter>\n'
        f'<{D}parameter name="nan" string="false">NaN</{D}parameter>\n'
        f'<{D}parameter name="text" string="true">say "hi"</{D}parameter>\n'
        f"</{D}invoke>"
    )
    (parsed,) = parse_calls(body)[1]
    got = parsed.arguments
    assert got == '{"big": 1e400, "exact": 0.1000000000000000055511151231257827, "nan": "NaN", "text": "say \\"hi\\""}'
    assert json.loads(got)["text"] == 'say "hi"'


def test_without_tools_offered_a_block_is_text_as_written():
    whole = parse_message(ANSWER, thinking=False, stopped=True, tools=False)
    assert whole.content == ANSWER and whole.calls == whole.started == []
    stream = AssistantStream(thinking=True, tools=False)  # the reasoning still ends at </think>
    parts = stream.feed("Hm.</think>" + ANSWER[:30]).then(stream.feed(ANSWER[30:])).then(stream.finish(True))
    assert (parts.reasoning, parts.content, parts.calls) == ("Hm.", ANSWER, [])
