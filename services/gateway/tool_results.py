"""Whether the tool results of a chat answer its calls as OpenAI and DeepSeek require: the tool
messages right after an assistant message with tool_calls answer each of its calls, by id, and no
tool message stands elsewhere ("Messages with role 'tool' must be a response to a preceding message
with 'tool_calls'"; "An assistant message with 'tool_calls' must be followed by tool messages
responding to each 'tool_call_id'"). Rendered, a call left unanswered showed the model a call whose
result never came; a result that answers no call, a result of a call it never made (or, its id
unknown, the results out of their calls' order); a second result of one call (OpenAI: "Duplicate
value for 'tool_call_id'"), two results where the call had one. OpenAI's deprecated form, an assistant's
function_call answered by a function message naming it, is held to the same rule (its call's id is the
function's name: message_schemas.Message.calls)."""

from __future__ import annotations

from collections import Counter
from typing import Protocol

from .message_schemas import ANSWERING


class _Call(Protocol):
    id: str


class _Message(Protocol):
    role: str
    calls_field: str  # the field its calls are in

    def calls(self) -> list[_Call]: ...
    def answered_call(self) -> str | None: ...


def unanswered_result(messages: list[_Message]) -> tuple[tuple[int, str], str] | None:
    """(index, field) of the first message that breaks the rule, and why; None when none does. The
    rule is by id, as OpenAI's ("responding to each 'tool_call_id'"): calls that share an id (some
    models and adapters write them) are answered by one result, or by one each, not by more (the
    encoder shows each call the id's result of its rank, else its last: chat/encoding.py)."""
    asker, asked, answered = None, Counter(), Counter()  # the assistant message answered; its calls, results by id
    asker_field = "tool_calls"
    for i, m in enumerate(messages):
        if field := ANSWERING.get(m.role):
            call_id = m.answered_call()
            if asker is None:
                return (i, "role"), f"a {m.role} message must answer the calls of the assistant message right before it"
            if call_id not in asked:
                return (i, field), _answers_no_call(call_id, field, asker_field)
            if (sharing := asked[call_id]) == answered[call_id]:
                times = "twice" if sharing == 1 else f"{sharing + 1} times for its {sharing} calls"
                return (i, field), f"{call_id!r} is answered {times} (duplicate value for {field!r})"
            answered[call_id] += 1
            continue
        if unanswered := _unanswered(asker, asker_field, asked, answered):
            return unanswered
        calls = m.calls() if m.role == "assistant" else []
        asker, asked, answered = (i if calls else None), Counter(c.id for c in calls), Counter()
        asker_field = m.calls_field
    return _unanswered(asker, asker_field, asked, answered)


# the message answering each form of calls: a tool_calls' call by its id, a function_call by its name
ANSWERED_BY = {"tool_calls": "a tool message", "function_call": "a function message"}


def _answers_no_call(call_id: str, field: str, asker_field: str) -> str:
    """Why a result's id (a function message's name) answers no call of the assistant message before it."""
    if field == "name" and asker_field == "tool_calls":  # (its calls' function names are not their ids)
        why = "its tool_calls are answered by tool messages, by id"
        return f"{call_id!r} names no function_call of the assistant message before it: {why}"
    what = "name" if field == "name" else "id"
    return f"{call_id!r} is the {what} of no call of the assistant message before it"


def _unanswered(asker: int | None, field: str, asked: Counter, answered: Counter) -> tuple[tuple[int, str], str] | None:
    if not (waiting := [call_id for call_id in asked if not answered[call_id]]):
        return None
    why = f"each call of an assistant message ({field}) must be answered by {ANSWERED_BY[field]} right after it: "
    return (asker, field), why + f"none answers {', '.join(map(repr, waiting))}"
