"""Chats -> prompt text the way DeepSeek-V4 was trained (no Jinja template ships with it).

Messages are OpenAI-shaped dicts: ``role`` (system, developer, user, assistant, tool,
latest_reminder), ``content`` (a string, or a list of part strings with each image already
``<｜deepseek_image｜>``; parts are joined by a blank line), and for assistants
``reasoning_content``, ``tool_calls`` and ``prefix`` (DeepSeek's chat prefix completion: the last
message, an assistant's beginning, which the model continues), for tools ``tool_call_id``.

The rules: BOS once; the system text (plus the tools and response-format sections); each user
turn ``<｜User｜>`` + text, and where the assistant speaks next ``<｜Assistant｜>`` + ``</think>``
(chat) or ``<think>`` (thinking: for the last user turn, or every turn when tools are defined);
assistant turns = [reasoning + ``</think>``] + content + [DSML tool calls] + EOS, the reasoning
kept only after the last user turn unless tools are defined (then old developer turns stay
too); tool results merge into the user turn as ``<tool_result>`` blocks in the calls' order, one
per call (calls that share an id may be answered by one result). A prefix turn has no EOS, and in
thinking mode a prefix of reasoning alone no ``</think>``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .dsml import render_calls, to_json
from .prompts import EFFORT_PARAGRAPHS, EFFORT_TABLES, RESPONSE_FORMAT_SECTION, TOOLS_SECTION
from .tokens import ASSISTANT, BOS, END_THINK, EOS, LATEST_REMINDER, THINK, USER

EFFORTS = tuple(EFFORT_PARAGRAPHS)


@dataclass(frozen=True, slots=True)
class ChatOptions:
    thinking: bool = False
    effort: str = "low"  # low | high | max: the paragraph opening a thinking-mode prompt
    tools: tuple[dict, ...] = ()  # OpenAI tool definitions ({"type": "function", "function": {...}})
    response_format: dict | None = None  # the JSON schema the reply must follow
    efforts: str = "0731"  # which checkpoint's table maps effort -> paragraph (prompts.EFFORT_TABLES)


CHAT_MODE = ChatOptions()


def continues_reasoning(messages: list[dict], thinking: bool) -> bool:
    """Whether the model's text opens inside its reasoning: thinking mode, unless the chat ends
    with a prefix that has reached the answer."""
    last = messages[-1] if messages else {}
    return thinking and not (last.get("prefix") and _answer(last))


def text_of(content: str | list[str] | None) -> str:
    return "\n\n".join(content) if isinstance(content, list) else content or ""


def encode_chat(messages: list[dict], options: ChatOptions = CHAT_MODE) -> str:
    """The prompt text, ready for the assistant's answer."""
    turns = _with_system(_merge_tool_results(messages), options)
    keep_reasoning = bool(options.tools)  # with tools, a whole agent loop stays in view
    if options.thinking and not keep_reasoning:
        last = _last_user(turns)
        turns = [t for i, t in enumerate(turns) if t["role"] != "developer" or i >= last]
    last = _last_user(turns)
    prompt = BOS + (EFFORT_TABLES[options.efforts][options.effort] if options.thinking else "")
    for i, turn in enumerate(turns):
        show_reasoning = options.thinking and (keep_reasoning or i > last)
        prompt += _render(turn, options, show_reasoning)
        following = turns[i + 1]["role"] if i + 1 < len(turns) else None
        if turn["role"] in ("user", "developer") and following in (None, "assistant", "latest_reminder"):
            open_thinking = options.thinking and (keep_reasoning or i >= last)
            prompt += ASSISTANT + (THINK if open_thinking else END_THINK)
    return prompt


def _render(turn: dict, options: ChatOptions, show_reasoning: bool) -> str:
    role = turn["role"]
    if role == "system":
        text = text_of(turn.get("content"))
        if turn.get("tools"):
            text += "\n\n" + _tools_section(options.tools)
        if turn.get("response_format"):
            text += "\n\n" + RESPONSE_FORMAT_SECTION + to_json(options.response_format)
        return text
    if role == "user":
        return USER + "\n\n".join(turn["blocks"])
    if role == "developer":
        return USER + text_of(turn.get("content"))
    if role == "latest_reminder":
        return LATEST_REMINDER + text_of(turn.get("content"))
    if role == "assistant":
        thought, answer = turn.get("reasoning_content") or "", _answer(turn)
        if turn.get("prefix") and show_reasoning and not answer:
            return thought  # the model goes on thinking
        return (thought + END_THINK if show_reasoning else "") + answer + ("" if turn.get("prefix") else EOS)
    raise ValueError(f"unknown role {role!r}")


def _answer(turn: dict) -> str:
    """An assistant turn's answer as rendered: its content, then its calls' DSML."""
    return text_of(turn.get("content")) + render_calls(turn.get("tool_calls") or [])


def _tools_section(tools: tuple[dict, ...]) -> str:
    return TOOLS_SECTION.format(schemas="\n".join(to_json(t["function"]) for t in tools))


def _with_system(turns: list[dict], options: ChatOptions) -> list[dict]:
    """Tools and the response format belong to the system turn (an empty one when there is none)."""
    if not options.tools and not options.response_format:  # as the reference: an empty schema {} adds nothing
        return turns
    marks = {"tools": bool(options.tools), "response_format": bool(options.response_format)}
    if turns and turns[0]["role"] == "system":
        return [{**turns[0], **marks}, *turns[1:]]
    return [{"role": "system", "content": "", **marks}, *turns]


def _merge_tool_results(messages: list[dict]) -> list[dict]:
    """Runs of user and tool messages become one user turn of blocks; tool results follow the
    order of the calls in the assistant turn before them, one per call answered."""
    turns: list[dict] = []
    call_ids: list[str] = []  # the ids of the latest assistant turn's calls, in order
    for m in messages:
        role = m["role"]
        if role == "assistant" and m.get("tool_calls"):
            call_ids = [call["id"] for call in m["tool_calls"] if call.get("id") is not None]  # ("" is an id)
        if role not in ("user", "tool"):
            turns.append(m)
            continue
        if not turns or turns[-1]["role"] != "user":
            turns.append({"role": "user", "blocks": [], "results": [], "call_ids": call_ids})
        turn = turns[-1]
        if role == "user":
            parts = m.get("content")
            turn["blocks"].extend(parts if isinstance(parts, list) else [parts or ""])
        else:
            turn["results"].append((m.get("tool_call_id"), f"<tool_result>{text_of(m.get('content'))}</tool_result>"))
            turn["blocks"].append(None)  # a result's place
    for turn in turns:
        if turn["role"] == "user":
            turn["blocks"] = _in_places(turn["blocks"], _in_call_order(turn["results"], turn["call_ids"]))
    return turns


def _in_call_order(results: list[tuple[str | None, str]], call_ids: list[str]) -> list[str]:
    """The results (id, block) ranked by the calls they answer. Calls may share an id (the gateway
    takes one result for the id, or one each): the id's k-th call is answered by its k-th result,
    else by its last, so each call shows a result; a result past its id's calls ranks at the last of
    them, one of no call first."""
    places: dict[str | None, list[int]] = {}
    for rank, call_id in enumerate(call_ids):
        places.setdefault(call_id, []).append(rank)
    answers: dict[str | None, list[int]] = {}  # id -> the indices of its results
    for i, (call_id, _) in enumerate(results):
        answers.setdefault(call_id, []).append(i)
    ranked = []  # (rank, result index)
    for call_id, indices in answers.items():
        ranks = places.get(call_id, [0])
        ranked += [(ranks[min(k, len(ranks) - 1)], i) for k, i in enumerate(indices)]
        ranked += [(rank, indices[-1]) for rank in ranks[len(indices) :]]
    return [results[i][1] for _, i in sorted(ranked)]


def _in_places(blocks: list[str | None], results: list[str]) -> list[str]:
    """The results put at the places (None) the tool messages held, in order; those past the last
    place (results that answer several calls) after it."""
    last = max((i for i, block in enumerate(blocks) if block is None), default=len(blocks))
    ordered = iter(results)
    head = [next(ordered) if block is None else block for block in blocks[:last]]
    return [*head, *ordered, *blocks[last + 1 :]]


def _last_user(turns: list[dict]) -> int:
    return max((i for i, t in enumerate(turns) if t["role"] in ("user", "developer")), default=-1)
