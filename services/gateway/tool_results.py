"""Which tool message answers no call: OpenAI and DeepSeek refuse one ("Messages with role 'tool'
must be a response to a preceding message with 'tool_calls'"); rendered, it showed the model a
result of a call it never made, or (an id no call has) put the results out of their calls' order."""

from __future__ import annotations

from typing import Protocol


class _Message(Protocol):
    role: str
    tool_calls: list | None
    tool_call_id: str | None


def unanswered_result(messages: list[_Message]) -> tuple[tuple[int, str], str] | None:
    """(index, field) of the first tool message that answers no call of the assistant message
    before it, and why; None when each does."""
    calls: set[str | None] | None = None  # the latest assistant message's call ids (None: it made none)
    for i, m in enumerate(messages):
        if m.role == "assistant":
            calls = {c.id for c in m.tool_calls} if m.tool_calls else None
        elif m.role == "tool" and calls is None:
            return (i, "role"), "a tool message must answer the tool_calls of an assistant message before it"
        elif m.role == "tool" and m.tool_call_id is not None and None not in calls and m.tool_call_id not in calls:
            return (i, "tool_call_id"), f"{m.tool_call_id!r} is the id of no call of the assistant message before it"
    return None
