"""DeepSeek-V4's prompt encoding against expected strings written out by hand."""

from __future__ import annotations

import json

from dayzero.chat.encoding import ChatOptions, continues_reasoning, encode_chat

B, E, U, A = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"
D = "｜DSML｜"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
# the tools section as DeepSeek's encoding_dsv4.py writes it (typed here line by line)
TOOLS_TEXT = "\n".join(
    [
        "## Tools",
        "",
        "You have access to a set of tools to help answer the user's question. You can invoke tools by "
        'writing a "<｜DSML｜tool_calls>" block like the following:',
        "",
        "<｜DSML｜tool_calls>",
        '<｜DSML｜invoke name="$TOOL_NAME">',
        '<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>',
        "...",
        "</｜DSML｜invoke>",
        '<｜DSML｜invoke name="$TOOL_NAME2">',
        "...",
        "</｜DSML｜invoke>",
        "</｜DSML｜tool_calls>",
        "",
        'String parameters should be specified as is and set `string="true"`. For all other types (numbers, '
        'booleans, arrays, objects), pass the value in JSON format and set `string="false"`.',
        "",
        "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
        "<think>...</think> BEFORE any tool calls or final response.",
        "",
        "Otherwise, output directly after </think> with tool calls or final response.",
        "",
        "### Available Tool Schemas",
        "",
        '{"name": "get_weather", "description": "Weather of a city", "parameters": {"type": "object", '
        '"properties": {"city": {"type": "string"}}, "required": ["city"]}}',
        "",
        "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.",
        "",
    ]
)
TURNS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!", "reasoning_content": "greet back"},
    {"role": "user", "content": "2+2?"},
]


def test_chat_mode_multi_turn():
    want = f"{B}Be brief.{U}Hi{A}</think>Hello!{E}{U}2+2?{A}</think>"
    assert encode_chat(TURNS) == want


def test_thinking_mode_drops_old_reasoning_and_opens_a_thought():
    want = f"{B}Be brief.{U}Hi{A}</think>Hello!{E}{U}2+2?{A}<think>"
    assert encode_chat(TURNS, ChatOptions(thinking=True)) == want


def test_thinking_mode_keeps_the_reasoning_after_the_last_user_turn():
    turns = [*TURNS[:2], {"role": "assistant", "content": "Hello!", "reasoning_content": "greet"}]
    assert encode_chat(turns, ChatOptions(thinking=True)) == f"{B}Be brief.{U}Hi{A}<think>greet</think>Hello!{E}"


def test_a_prefix_is_continued_not_closed():
    """DeepSeek's chat prefix completion: the last assistant message is the answer's beginning."""
    code = {"role": "assistant", "content": "```python\n", "prefix": True}
    chat = [*TURNS, code]
    assert encode_chat(chat) == f"{B}Be brief.{U}Hi{A}</think>Hello!{E}{U}2+2?{A}</think>```python\n"
    thinking = ChatOptions(thinking=True)
    answer = {**code, "reasoning_content": "add them"}
    assert encode_chat([*TURNS, answer], thinking).endswith(f"{U}2+2?{A}<think>add them</think>```python\n")
    thought = {"role": "assistant", "reasoning_content": "First, ", "prefix": True}
    assert encode_chat([*TURNS, thought], thinking).endswith(f"{U}2+2?{A}<think>First, ")
    assert not continues_reasoning([*TURNS, answer], True) and continues_reasoning([*TURNS, thought], True)
    assert continues_reasoning(TURNS, True) and not continues_reasoning([*TURNS, thought], False)
    parts = {**thought, "content": [""]}  # empty parts: no answer yet, as the prompt renders it
    assert continues_reasoning([*TURNS, parts], True) and encode_chat([*TURNS, parts], thinking).endswith("First, ")


def test_reasoning_effort_paragraph_opens_the_prompt():
    high = (
        "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
        "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the "
        "root cause, rigorously stress-testing your logic against all potential paths, edge cases, and "
        "adversarial scenarios.\nExplicitly write out your entire deliberation process, documenting every "
        "intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption "
        "is left unchecked.\n\n"
    )
    user = [{"role": "user", "content": "Hi"}]
    assert encode_chat(user, ChatOptions(thinking=True, effort="high")) == f"{B}{high}{U}Hi{A}<think>"
    assert encode_chat(user, ChatOptions(thinking=True, effort="max")).startswith(
        B + "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\nYou MUST reason"
    )
    assert encode_chat(user, ChatOptions(thinking=True, effort="low")) == f"{B}{U}Hi{A}<think>"
    assert encode_chat(user, ChatOptions(effort="high")) == f"{B}{U}Hi{A}</think>"  # chat mode: no paragraph


def test_tools_go_into_the_system_prompt():
    user = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Paris?"}]
    assert encode_chat(user, ChatOptions(tools=(WEATHER,))) == f"{B}Be brief.\n\n{TOOLS_TEXT}{U}Paris?{A}</think>"
    alone = encode_chat(user[1:], ChatOptions(tools=(WEATHER,)))
    assert alone == f"{B}\n\n{TOOLS_TEXT}{U}Paris?{A}</think>"  # no system message: an empty one carries them


def _tool_round(thinking: bool) -> str:
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome", "n": 2}'}},
    ]
    chat = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "reasoning_content": "two cities", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},  # answered out of order
        {"role": "tool", "tool_call_id": "c1", "content": "sun"},
    ]
    return encode_chat(chat, ChatOptions(thinking=thinking, tools=(WEATHER,)))


def test_tool_calls_and_results():
    block = (
        f"\n\n<{D}tool_calls>\n"
        f'<{D}invoke name="get_weather">\n<{D}parameter name="city" string="true">Paris</{D}parameter>\n'
        f"</{D}invoke>\n"
        f'<{D}invoke name="get_weather">\n<{D}parameter name="city" string="true">Rome</{D}parameter>\n'
        f'<{D}parameter name="n" string="false">2</{D}parameter>\n</{D}invoke>\n'
        f"</{D}tool_calls>"
    )
    results = f"{U}<tool_result>sun</tool_result>\n\n<tool_result>rain</tool_result>"  # in the calls' order
    head = f"{B}\n\n{TOOLS_TEXT}{U}Weather?{A}"
    assert _tool_round(False) == f"{head}</think>{block}{E}{results}{A}</think>"
    # thinking with tools: the reasoning of the loop stays, every user turn opens a thought
    assert _tool_round(True) == f"{head}<think>two cities</think>{block}{E}{results}{A}<think>"


def test_a_result_whose_call_id_is_empty_keeps_its_calls_place():
    """An id is any string, "" too (the gateway takes it): the results are ranked by their calls' ids,
    and a call with id "" was ranked as the first call (its result answered out of order was shown
    as the first call's)."""
    calls = [
        {"id": i, "type": "function", "function": {"name": n, "arguments": "{}"}} for i, n in (("a", "f"), ("", "g"))
    ]
    chat = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "", "content": "g's"},
        {"role": "tool", "tool_call_id": "a", "content": "f's"},
    ]
    assert encode_chat(chat).endswith(f"{U}<tool_result>f's</tool_result>\n\n<tool_result>g's</tool_result>{A}</think>")


def test_results_of_calls_that_share_an_id_keep_their_calls_places():
    """Calls of one turn may share an id (the gateway takes one result for the id, or one each): the
    id's k-th result answers its k-th call. Each was ranked at the id's last call: calls f, g, h with
    ids a, b, a answered in order showed g's result first (as f's), and a's one result after g's."""
    ids = (("a", "f"), ("b", "g"), ("a", "h"))
    calls = [{"id": i, "type": "function", "function": {"name": n, "arguments": "{}"}} for i, n in ids]
    asked = [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": calls}]
    results = [{"role": "tool", "tool_call_id": i, "content": f"{n}'s"} for i, n in ids]
    blocks = "\n\n".join(f"<tool_result>{n}'s</tool_result>" for n in "fgh")
    assert encode_chat([*asked, *results]).endswith(f"{U}{blocks}{A}</think>")
    assert encode_chat([*asked, results[1], results[0], results[2]]).endswith(f"{U}{blocks}{A}</think>")


def test_one_result_of_calls_that_share_an_id_answers_each_of_them():
    """One result answers all the calls of its id (OpenAI's rule is by id; the gateway takes it): it
    was rendered once, after g's, so the model saw h's invoke with no result. Each call shows it now,
    in its place; a user's text after the results stays after them."""
    calls = [
        {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps({"city": c})}}
        for i, n, c in (("a", "f", "Paris"), ("b", "g", "Rome"), ("a", "h", "Oslo"))
    ]
    chat = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "b", "content": "rain"},
        {"role": "tool", "tool_call_id": "a", "content": "sun"},
        {"role": "user", "content": "and?"},
    ]
    want = (
        f"{B}{U}q{A}</think>\n\n<{D}tool_calls>\n"
        f'<{D}invoke name="f">\n<{D}parameter name="city" string="true">Paris</{D}parameter>\n</{D}invoke>\n'
        f'<{D}invoke name="g">\n<{D}parameter name="city" string="true">Rome</{D}parameter>\n</{D}invoke>\n'
        f'<{D}invoke name="h">\n<{D}parameter name="city" string="true">Oslo</{D}parameter>\n</{D}invoke>\n'
        f"</{D}tool_calls>{E}"
        f"{U}<tool_result>sun</tool_result>\n\n<tool_result>rain</tool_result>\n\n<tool_result>sun</tool_result>"
        f"\n\nand?{A}</think>"
    )
    assert encode_chat(chat) == want


def test_images_developer_and_latest_reminder():
    chat = [
        {"role": "developer", "content": "Answer in French."},
        {"role": "user", "content": ["What is this?", "<｜deepseek_image｜>"]},
        {"role": "latest_reminder", "content": "Today is Monday."},
    ]
    image = "<｜deepseek_image｜>"
    want = f"{B}{U}Answer in French.{U}What is this?\n\n{image}{A}</think><｜latest_reminder｜>Today is Monday."
    assert encode_chat(chat) == want
    # thinking mode without tools: a developer turn before the last user turn is dropped
    thinking = encode_chat(
        [*chat[:2], {"role": "assistant", "content": "Un chat."}, {"role": "user", "content": "Sûr ?"}],
        ChatOptions(thinking=True),
    )
    assert thinking == f"{B}{U}What is this?\n\n<｜deepseek_image｜>{A}</think>Un chat.{E}{U}Sûr ?{A}<think>"


def test_response_format_section():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    got = encode_chat([{"role": "user", "content": "Go"}], ChatOptions(response_format=schema))
    section = (
        "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
        '{"type": "object", "properties": {"a": {"type": "integer"}}}'
    )
    assert got == f"{B}\n\n{section}{U}Go{A}</think>"
    assert encode_chat([{"role": "user", "content": "Go"}], ChatOptions(response_format={})) == f"{B}{U}Go{A}</think>"


def test_effort_paragraphs_follow_the_checkpoint_revision():
    """DeepSeek-V4-Flash / -Pro as released: only "max" adds a paragraph (the "Absolute maximum" one);
    the 0731 / Vision-Exp revision moved that text to "high" and gave "max" a new one."""
    from dayzero.chat.prompts import EFFORT_TABLES, effort_table_of

    user = [{"role": "user", "content": "Hi"}]
    absolute = EFFORT_TABLES["0731"]["high"]
    assert encode_chat(user, ChatOptions(thinking=True, effort="high", efforts="v4")) == f"{B}{U}Hi{A}<think>"
    assert encode_chat(user, ChatOptions(thinking=True, effort="max", efforts="v4")) == f"{B}{absolute}{U}Hi{A}<think>"
    assert effort_table_of("REASONING_EFFORT_MAX = (") == "v4"
    assert effort_table_of("REASONING_EFFORT_PROMPTS: Dict[str, str] = {") == "0731"
    assert effort_table_of(None) is None


def test_a_call_cut_before_its_arguments_renders_without_parameters():
    """dayzero's own reply to a call cut by max_tokens has ``arguments: ""``: sent back in the history
    it renders as a call with no parameters, as ``"{}"`` (DeepSeek's encoder, given a string it
    cannot parse, would write a parameter named ``arguments``: README)."""

    def chat(arguments: str) -> list[dict]:
        call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
        return [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "", "tool_calls": [call]}]

    got = encode_chat(chat(""), ChatOptions(tools=(WEATHER,)))
    assert got == encode_chat(chat("{}"), ChatOptions(tools=(WEATHER,)))
    assert f'<{D}invoke name="get_weather">\n\n</{D}invoke>' in got  # no parameter lines


def test_arguments_nested_past_the_json_parsers_limit_are_rendered_as_text():
    """A history call's arguments nested 5000 deep (Python's json recurses: a RecursionError was a
    500) render as DeepSeek's encoder renders arguments it cannot read: one ``arguments`` parameter."""
    from dayzero.chat.dsml import parse_calls

    deep = "[" * 5000 + "]" * 5000
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": deep}}
    chat = [{"role": "user", "content": "W"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    got = encode_chat(chat, ChatOptions(tools=(WEATHER,)))
    assert f'<{D}parameter name="arguments" string="true">{deep}</{D}parameter>' in got
    invoke = f'<{D}invoke name="f">\n<{D}parameter name="k" string="false">{deep}</{D}parameter>\n</{D}invoke>'
    (parsed,) = parse_calls(invoke)[1]
    assert json.loads(parsed.arguments) == {"k": deep}  # the model's own: kept as a string
