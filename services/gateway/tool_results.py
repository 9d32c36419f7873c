"""Whether the tool results of a chat answer its calls as OpenAI and DeepSeek require: the tool
messages right after an assistant message with tool_calls answer each of its calls, by id, and no
tool message stands elsewhere ("Messages with role 'tool' must be a response to a preceding message
with 'tool_calls'"; "An assistant message with 'tool_calls' must be followed by tool messages
responding to each 'tool_call_id'"). Rendered, a call left unanswered showed the model a call whose
result never came; a result that answers no call, a result of a call it never made (or, its id
unknown, the results out of their calls' order); a second result of one call (OpenAI: "Duplicate
value for 'tool_call_id'"), two results where the call had one."""

from __future__ import annotations

from collections import Counter
from typing import Protocol


class _Call(Protocol):
    id: str


class _Message(Protocol):
    role: str
    tool_calls: list[_Call] | None
    tool_call_id: str | None


def unanswered_result(messages: list[_Message]) -> tuple[tuple[int, str], str] | None:
    """(index, field) of the first message that breaks the rule, and why; None when none does. The
    rule is by id, as OpenAI's ("responding to each 'tool_call_id'"): calls that share an id (some
    models and adapters write them) are answered by one result, or by one each, not by more (the
    encoder shows each call the id's result of its rank, else its last: chat/encoding.py)."""
    asker, asked, answered = None, Counter(), Counter()  # the assistant message answered; its calls, results by id
    for i, m in enumerate(messages):
        if m.role == "tool":
            if asker is None:
                return (i, "role"), "a tool message must answer the tool_calls of the assistant message right before it"
            if m.tool_call_id not in asked:
                why = f"{m.tool_call_id!r} is the id of no call of the assistant message before it"
                return (i, "tool_call_id"), why
            if (sharing := asked[m.tool_call_id]) == answered[m.tool_call_id]:
                times = "twice" if sharing == 1 else f"{sharing + 1} times for its {sharing} calls"
                why = f"{m.tool_call_id!r} is answered {times} (duplicate value for 'tool_call_id')"
                return (i, "tool_call_id"), why
            answered[m.tool_call_id] += 1
            continue
        if unanswered := _unanswered(asker, asked, answered):
            return unanswered
        calls = (m.tool_calls or []) if m.role == "assistant" else []
        asker, asked, answered = (i if calls else None), Counter(c.id for c in calls), Counter()
    return _unanswered(asker, asked, answered)


def _unanswered(asker: int | None, asked: Counter, answered: Counter) -> tuple[tuple[int, str], str] | None:
    if not (waiting := [call_id for call_id in asked if not answered[call_id]]):
        return None
    why = "an assistant message's tool_calls must each be answered by a tool message right after it: "
    return (asker, "tool_calls"), why + f"none answers {', '.join(map(repr, waiting))}"
