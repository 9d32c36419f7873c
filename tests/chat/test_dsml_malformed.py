"""DSML the model gets wrong or goes on after, written by hand: the streamed split equals the whole
text's for every cut, a call's name and arguments stay paired, and a call left open ends with the reply."""

from __future__ import annotations

import json

from dayzero.chat.output import AssistantStream, parse_message

D = "｜DSML｜"
X = f'<{D}parameter name="x" string="false">1</{D}parameter>'
Y = f'<{D}parameter name="y" string="true">two</{D}parameter>'


def _calls(parts) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in parts.calls]


def _streamed(text: str, cuts: list[int], stopped: bool = False):
    stream, edges = AssistantStream(False), [0, *cuts, len(text)]
    whole = stream.feed("")
    for a, b in zip(edges, edges[1:], strict=False):
        whole = whole.then(stream.feed(text[a:b]))
    return whole.then(stream.finish(stopped))


def _every_cut(text: str, stopped: bool = False):
    """The whole text's parts, checked equal to the stream's for one cut anywhere and char by char."""
    whole = parse_message(text, thinking=False, stopped=stopped)
    for cuts in [*([c] for c in range(1, len(text))), list(range(1, len(text)))]:
        part = _streamed(text, cuts, stopped)
        assert (part.content, part.started, _calls(part)) == (whole.content, whole.started, _calls(whole)), cuts
    return whole


def test_text_after_a_block_reads_the_same_streamed():
    text = f'Hi\n\n<{D}tool_calls>\n<{D}invoke name="f">\n{X}\n</{D}invoke>\n</{D}tool_calls>\n\nDone.'
    parts = _every_cut(text)
    assert parts.content == "Hi\n\nDone." and _calls(parts) == [("f", {"x": 1})]


def test_an_invoke_left_open_ends_at_the_next_one():
    text = f'<{D}tool_calls>\n<{D}invoke name="a">\n{X}\n<{D}invoke name="b">\n{Y}\n</{D}invoke>\n</{D}tool_calls>'
    parts = _every_cut(text)
    assert parts.started == ["a", "b"] and _calls(parts) == [("a", {"x": 1}), ("b", {"y": "two"})]


def test_an_invoke_left_open_ends_with_its_block():
    text = f'<{D}tool_calls>\n<{D}invoke name="a">\n{X}\n</{D}tool_calls>after'
    parts = _every_cut(text)
    assert parts.content == "after" and _calls(parts) == [("a", {"x": 1})]


def test_a_reply_that_stops_inside_a_call_ends_it_with_its_complete_parameters():
    text = f'Sure.\n\n<{D}tool_calls>\n<{D}invoke name="a">\n{X}\n<{D}parameter name="y" string="true">tw'
    stopped = _every_cut(text, stopped=True)
    assert stopped.content == "Sure." and stopped.started == ["a"] and _calls(stopped) == [("a", {"x": 1})]
    cut = _every_cut(text, stopped=False)  # max_tokens: begun, without arguments
    assert cut.started == ["a"] and cut.calls == []


def test_a_reply_that_ends_with_a_full_width_bar_keeps_it():
    # "｜" (U+FF5C) is CJK punctuation too; the model's ｜DSML｜ is one token, never cut after its "｜"
    for text in ("选项A｜选项B｜", "see ｜DS", "a <｜"):
        assert _every_cut(text, stopped=True).content == text


def test_markup_inside_a_string_value_is_the_values():
    # DeepSeek's decoder reads a value up to </｜DSML｜parameter>: an agent writing DSML into a file
    for value in (f'<{D}invoke name="evil">', f"a</{D}tool_calls>b", f"</{D}invoke>\n\n<{D}tool_calls>"):
        param = f'<{D}parameter name="v" string="true">{value}</{D}parameter>'
        text = f'ok\n\n<{D}tool_calls>\n<{D}invoke name="write">\n{param}\n</{D}invoke>\n</{D}tool_calls>'
        parts = _every_cut(text)
        assert parts.content == "ok" and parts.started == ["write"] and _calls(parts) == [("write", {"v": value})]


def test_a_bare_dsml_token_after_a_blank_line_reads_the_same_streamed():
    block = f'<{D}tool_calls>\n<{D}invoke name="f">\n{X}\n</{D}invoke>\n</{D}tool_calls>'
    parts = _every_cut(f"Let me check.\n\n{D}{block}")
    assert parts.content == "Let me check." and _calls(parts) == [("f", {"x": 1})]


def test_a_dsml_token_that_begins_no_block_is_dropped_with_its_tag_and_the_text_goes_on():
    """DeepSeek's decoder refuses such a reply; a server keeps the text (it lost all of it after
    the token), never the DSML."""
    block = f'\n\n<{D}tool_calls>\n<{D}invoke name="f">\n{X}\n</{D}invoke>\n</{D}tool_calls>'
    for stray in (D, f"<{D}", f"</{D}", f"</{D}invoke>", f"</{D}tool_calls>", f'<{D}parameter name="v" string="true">'):
        for stopped in (True, False):
            parts = _every_cut(f"The {stray}token, then more.", stopped)
            assert parts.content == "The token, then more." and parts.started == [], (stray, stopped)
        parts = _every_cut(f"Check {stray}this.{block}", stopped=True)  # and a real block after it
        assert parts.content == "Check this." and _calls(parts) == [("f", {"x": 1})], stray
    assert _every_cut(f"ends <{D}tool_ca", stopped=True).content == "ends "  # a tag the reply ended in
    assert _every_cut(f"ends <{D}tool_ca", stopped=False).content == "ends "  # cut there by a limit
