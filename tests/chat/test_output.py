"""An assistant's text as OpenAI's message parts: the thought's marks never reach the answer."""

from __future__ import annotations

import pytest

from dayzero.chat.output import AssistantStream, parse_message

CALL = '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>'


@pytest.mark.parametrize("tools", [False, True])
@pytest.mark.parametrize(
    ("thinking", "text", "reasoning", "content"),
    [
        (False, "Hi <think>there</think> you", "", "Hi there you"),  # chat mode: the prompt ended the thought
        (False, "</think><think>", "", ""),
        (True, "plan</think>Hi </think>x<think>", "plan", "Hi x"),  # again after the thought
        (False, "a <thi", "", "a <thi"),  # an end that never became a mark is text
        (False, "1 < 2 <b>", "", "1 < 2 <b>"),
    ],
)
def test_the_answer_drops_the_thoughts_marks_whole_or_streamed(thinking, text, reasoning, content, tools):
    """DeepSeek's decoder refuses a reply whose content holds ``<think>`` or ``</think>`` ("Unexpected
    special token in content"); a chat-mode reply showed them in ``content``."""
    whole = parse_message(text, thinking, stopped=True, tools=tools)
    assert (whole.reasoning, whole.content) == (reasoning, content)
    stream = AssistantStream(thinking, tools)
    parts = [stream.feed(c) for c in text] + [stream.finish(stopped=True)]
    assert "".join(p.reasoning for p in parts) == reasoning and "".join(p.content for p in parts) == content


def test_a_call_after_a_dropped_mark_is_still_a_call():
    reply = parse_message("Sure.</think>" + CALL, thinking=False, stopped=True)
    assert reply.content == "Sure." and [c.name for c in reply.calls] == ["f"]
