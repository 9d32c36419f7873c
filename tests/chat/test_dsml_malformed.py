"""DSML the model gets wrong or goes on after, written by hand: the streamed split equals the whole
text's for every cut."""

from __future__ import annotations

import json

from dayzero.chat.output import AssistantStream, parse_message

D = "｜DSML｜"
X = f'<{D}parameter name="x" string="false">1</{D}parameter>'


def _calls(parts) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in parts.calls]


def _streamed(text: str, cuts: list[int]):
    stream, edges = AssistantStream(False), [0, *cuts, len(text)]
    whole = stream.feed("")
    for a, b in zip(edges, edges[1:], strict=False):
        whole = whole.then(stream.feed(text[a:b]))
    return whole.then(stream.finish())


def _every_cut(text: str):
    """The whole text's parts, checked equal to the stream's for one cut anywhere and char by char."""
    whole = parse_message(text, thinking=False)
    for cuts in [*([c] for c in range(1, len(text))), list(range(1, len(text)))]:
        part = _streamed(text, cuts)
        assert (part.content, part.started, _calls(part)) == (whole.content, whole.started, _calls(whole)), cuts
    return whole


def test_text_after_a_block_reads_the_same_streamed():
    text = f'Hi\n\n<{D}tool_calls>\n<{D}invoke name="f">\n{X}\n</{D}invoke>\n</{D}tool_calls>\n\nDone.'
    parts = _every_cut(text)
    assert parts.content == "HiDone." and _calls(parts) == [("f", {"x": 1})]
