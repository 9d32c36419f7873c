"""An assistant's raw text -> OpenAI's message parts: reasoning_content, content, tool calls."""

from __future__ import annotations

from dataclasses import dataclass, field

from .dsml import Parsed, ToolCall, ToolCallStream
from .reasoning import ReasoningSplitter


@dataclass(slots=True)
class Delta:
    reasoning: str = ""
    content: str = ""
    started: list[str] = field(default_factory=list)  # calls begun (their names), in order
    calls: list[ToolCall] = field(default_factory=list)  # calls completed, in order

    def then(self, later: Delta) -> Delta:
        """This delta followed by ``later``."""
        return Delta(
            self.reasoning + later.reasoning,
            self.content + later.content,
            self.started + later.started,
            self.calls + later.calls,
        )


class AssistantStream:
    """Splits text fed in any pieces; ``finish`` at the end (a stream cut anywhere, inside a tag too).
    Without ``tools`` offered, the answer is its text as written: a call block the model writes
    anyway is neither a call nor dropped (as vLLM answers a request without tools). ``calls_only``:
    a grammar holds the answer to calls (tool_choice required or named)."""

    def __init__(self, thinking: bool, tools: bool = True, calls_only: bool = False) -> None:
        self._reasoning = ReasoningSplitter(thinking)
        self._calls = ToolCallStream(calls_only) if tools else None

    def feed(self, text: str) -> Delta:
        reasoning, answer = self._reasoning.feed(text)
        return _delta(reasoning, self._calls.feed(answer) if self._calls else Parsed(answer))

    def finish(self, stopped: bool = False) -> Delta:
        """``stopped``: the model ended its reply (a call it left open ends too), not a limit."""
        return _delta(self._reasoning.finish(), self._calls.finish(stopped) if self._calls else Parsed())


def _delta(reasoning: str, parsed: Parsed) -> Delta:
    return Delta(reasoning, parsed.content, parsed.started, parsed.calls)


def parse_message(
    text: str, thinking: bool, stopped: bool = False, tools: bool = True, calls_only: bool = False
) -> Delta:
    """A whole completion's parts."""
    stream = AssistantStream(thinking, tools, calls_only)
    return stream.feed(text).then(stream.finish(stopped))
