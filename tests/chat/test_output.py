"""An assistant's text as OpenAI's message parts: the thought's marks never reach the answer nor the thought."""

from __future__ import annotations

import random

import pytest

from dayzero.chat.auto_grammar import auto_calls_grammar
from dayzero.chat.grammar import dsml_symbol
from dayzero.chat.output import HELD_MOST, AssistantStream, _Unmarked, parse_message
from dayzero.chat.tokens import DSML, END_THINK, THINK

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
        (True, "a <think>b<think></think>c", "a b", "c"),  # within the thought
        (True, "<think>plan", "plan", ""),  # a thought cut before its end
        (True, "a <thi</think>b", "a <thi", "b"),  # the thought's end is no mark's start
        (True, "</<think>think>x", "x", ""),  # nor is text joined across a dropped one
        (False, "</<</think>think>think>x", "", "x"),  # (streamed, "</think>x" came: marks' starts nested)
        (False, "<" * 9 + "think>" * 9 + "x", "", "x"),  # (streamed, a fifth nested "<" came)
        (True, "<" * 6 + "think>" * 6 + "x</think>y", "x", "y"),  # (in the thought)
        (False, "</" * 5 + "think>" * 5 + "x", "", "x"),
    ],
)
def test_the_answer_drops_the_thoughts_marks_whole_or_streamed(thinking, text, reasoning, content, tools):
    """DeepSeek's decoder refuses a reply whose content holds ``<think>`` or ``</think>`` ("Unexpected
    special token in content"); a chat-mode reply showed them in ``content``, and a thought showed a
    ``<think>`` written within it in ``reasoning_content``."""
    whole = parse_message(text, thinking, stopped=True, tools=tools)
    assert (whole.reasoning, whole.content) == (reasoning, content)
    stream = AssistantStream(thinking, tools)
    parts = [stream.feed(c) for c in text] + [stream.finish(stopped=True)]
    assert "".join(p.reasoning for p in parts) == reasoning and "".join(p.content for p in parts) == content


def test_a_call_after_a_dropped_mark_is_still_a_call():
    reply = parse_message("Sure.</think>" + CALL, thinking=False, stopped=True)
    assert reply.content == "Sure." and [c.name for c in reply.calls] == ["f"]


WEATHER = {
    "type": "function",
    "function": {"name": "weather", "strict": True, "parameters": {"type": "object", "properties": {"days": {}}}},
}
TAGS = ("tool_calls>\n<", 'invoke name="weather">\n<', 'parameter name="days" string="true">soon</', "parameter>\n</")


@pytest.mark.parametrize("thinking", [True, False], ids=["token_after_the_thought", "spelled_in_chat_mode"])
def test_text_joined_across_a_dropped_mark_is_no_call_and_spells_no_marker(codec, thinking):
    """The strict-auto grammar lets free text hold a thought's mark (after the thought its token, in
    chat mode its text in pieces): ``<｜DS</think>ML｜tool_calls>`` was read as a block once the mark
    was dropped, a strict tool's call the grammar never held (days "soon")."""
    mark = [codec.token_id(END_THINK)] if thinking else codec.encode("<")[1:] + codec.encode("/think>")[1:]
    ids = codec.encode("plan")[1:] + mark if thinking else []
    for text in ("ok <", *TAGS, "invoke>\n</", "tool_calls>"):
        ids += codec.encode(text)[1:] + (codec.encode(DSML[:3])[1:] + mark + codec.encode(DSML[3:])[1:]) * (
            text != "tool_calls>"
        )
    kept = tuple(f"<[{codec.token_id(t)}]>" for t in (THINK, END_THINK)) if thinking else ()
    matcher = codec.grammars.matcher(auto_calls_grammar([WEATHER], dsml_symbol(codec.token_id(DSML), DSML), kept))
    assert matcher.try_consume_tokens(ids) == len(ids), "the grammar takes it: a reply may write it"
    text = codec.decode_all(ids)
    content = "ok <" + "".join((*TAGS, "invoke>\n</", "tool_calls>"))
    whole = parse_message(text, thinking, stopped=True)
    assert (whole.calls, whole.content) == ([], content), whole
    stream = AssistantStream(thinking)
    parts = [stream.feed(c) for c in text] + [stream.finish(stopped=True)]
    assert [c for p in parts for c in p.calls] == [] and "".join(p.content for p in parts) == content


@pytest.mark.parametrize("as_text", [False, True], ids=["its_token", "its_text_in_pieces"])
def test_a_mark_within_the_thought_is_dropped_in_order_streamed_or_whole(codec, as_text):
    """Token by token as a stream gets them: ``<think>`` within the thought as its token or its text
    in pieces, dropped from the reasoning as from the one body's; and a mark's start held back in
    the thought is released when the thought ends, before the answer (not after it, at the end)."""
    think = codec.encode("<th")[1:] + codec.encode("ink>")[1:] if as_text else [codec.token_id(THINK)]
    ids = codec.encode("plan ")[1:] + think + codec.encode("more <thi")[1:] + [codec.token_id(END_THINK)]
    ids += codec.encode("Hi")[1:]
    whole = parse_message(codec.decode(ids), thinking=True, stopped=True)
    assert (whole.reasoning, whole.content) == ("plan more <thi", "Hi"), whole
    stream = AssistantStream(thinking=True)
    parts = [stream.feed(codec.decode([token])) for token in ids] + [stream.finish(stopped=True)]
    assert "".join(p.reasoning for p in parts) == whole.reasoning and "".join(p.content for p in parts) == "Hi"
    answered = next(i for i, p in enumerate(parts) if p.content)
    assert not any(p.reasoning for p in parts[answered + 1 :]), parts


def _starts(text: str, marks: tuple[str, ...]) -> list[int]:
    """Where each of the marks' starts (proper prefixes of a mark, one after another) that end
    ``text`` begins, last first (every mark opens with a character it holds nowhere before its end)."""
    openers, begins, end = {m[0] for m in marks}, [], len(text)
    for i in range(len(text) - 1, -1, -1):
        if text[i] in openers:
            if not any(len(text[i:end]) < len(m) and m.startswith(text[i:end]) for m in marks):
                break
            begins.append(i)
            end = i
        elif end - i >= max(map(len, marks)):
            break
    return begins


def _unmarked_by_hand(text: str, marks: tuple[str, ...], most: int) -> tuple[str, list[int]]:
    """The text walked one character at a time, a mark dropped as soon as what is kept ends with it,
    but never what was released: the characters before the marks' starts that end it, and of those
    starts all but the last ``most`` characters (whole starts). The text kept, and how much of it was
    released after each character."""
    kept, out, released = "", 0, []
    for char in text:
        kept += char
        kept = next((kept[: max(len(kept) - len(m), out)] for m in marks if kept.endswith(m)), kept)
        begins = [i for i in _starts(kept, marks) if i >= len(kept) - most]
        out = max(out, min(begins, default=len(kept)))
        released.append(out)
    return kept, released


@pytest.mark.parametrize("marks", [(THINK, END_THINK), (THINK, END_THINK, DSML)])
def test_marks_dropped_in_random_pieces_as_one_character_at_a_time(marks):
    """Marks are removed at the places they can complete, not at every character: a closer after a
    removal joins what was held (``<</think>think>``), a mark written in the piece completes alone.
    Random texts of marks, their parts and nests, cut at random, against the walk by hand; runs of
    starts past what is held (``HELD_MOST``) released as the walk releases them, whatever the cuts."""
    rng = random.Random(16)
    most = HELD_MOST * (max(map(len, marks)) - 1)
    parts = ["<", "</", "think>", "hink>", ">", "x", DSML, "｜", "DSML", "｜DS", "ML｜", "<thi", "nk>", "<<", "｜｜"]
    for _ in range(800):
        text = "".join(rng.choice(parts + list(marks) + ["<" * 12, "</" * 6]) for _ in range(rng.randint(0, 40)))
        cuts = sorted(rng.choices(range(len(text) + 1), k=rng.randint(1, 10)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        unmarked = _Unmarked(marks)
        released = [unmarked.feed(p) for p in pieces[:-1]]
        streamed = "".join(released) + unmarked.feed(pieces[-1], last=True)
        kept, by_hand = _unmarked_by_hand(text, marks, most)
        assert streamed == kept, pieces
        streamed_by = [len("".join(released[: i + 1])) for i in range(len(released))]
        assert streamed_by == [by_hand[end - 1] if end else 0 for end in cuts], pieces  # each piece's


@pytest.mark.parametrize("run", ["<", "<｜", "</"])
@pytest.mark.parametrize("thinking", [False, True])
def test_a_run_of_marks_starts_streams_but_for_its_end(run, thinking):
    """A model stuck writing ``<`` (or ``<｜``) streamed nothing till it stopped: the whole run was
    held, as marks' starts nested however deep. It streams as it comes but for its last
    ``HELD_MOST`` starts' length (and a mark's start the splitter before holds), and the stream is
    the body."""
    text = run * 500 + "think>" * 3 + "x"
    most = HELD_MOST * (len(END_THINK) - 1) + len(END_THINK)
    stream = AssistantStream(thinking)
    parts = [stream.feed(c) for c in run * 500]
    streamed = "".join(p.reasoning if thinking else p.content for p in parts)
    assert len(run * 500) - most <= len(streamed) < len(run * 500), len(streamed)
    parts += [stream.feed(c) for c in text[len(run) * 500 :]] + [stream.finish(stopped=True)]
    whole = parse_message(text, thinking, stopped=True)
    assert "".join(p.reasoning for p in parts) == whole.reasoning
    assert "".join(p.content for p in parts) == whole.content
    assert not any(mark in part for mark in (THINK, END_THINK) for part in (whole.reasoning, whole.content))


@pytest.mark.parametrize("tools", [False, True])
def test_a_mark_completed_across_released_text_loses_its_held_rest_only(tools):
    """``<thin`` then four ``</thin`` (29 characters of starts: past the 28 held, so ``<thin`` is
    released), the four closed and dropped, then ``k>``: ``<think>`` completes across the released
    ``<thin``, and only its ``k>`` is dropped; the answer holds no ``<think>``, streamed or whole
    (random texts never reached it: the release of a start nested past the cap, then its rest)."""
    text = "<thin" + "</thin" * 4 + "k>" * 4 + "k>x"
    stream = AssistantStream(thinking=False, tools=tools)
    parts = [stream.feed(c) for c in text] + [stream.finish(stopped=True)]
    whole = parse_message(text, thinking=False, stopped=True, tools=tools)
    assert "".join(p.content for p in parts) == whole.content == "<thinx"
