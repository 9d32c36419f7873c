"""An assistant's raw text -> OpenAI's message parts: reasoning_content, content, tool calls."""

from __future__ import annotations

from dataclasses import dataclass, field

from .dsml import Parsed, ToolCall, ToolCallStream, held_suffix
from .reasoning import ReasoningSplitter
from .tokens import END_THINK, THINK

_THOUGHT_MARKS = (THINK, END_THINK)


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
    a grammar holds the answer to calls (tool_choice required or named).

    The answer never holds ``<think>`` or ``</think>`` (a model in chat mode may write them, or write
    them again after its thought): DeepSeek's decoder refuses such a reply ("Unexpected special token
    in content"); they are dropped, as a stray DSML tag is, and the text around them kept."""

    def __init__(self, thinking: bool, tools: bool = True, calls_only: bool = False) -> None:
        self._reasoning = ReasoningSplitter(thinking)
        self._calls = ToolCallStream(calls_only) if tools else None
        self._held = ""  # the answer's end that may grow into a thought's mark

    def feed(self, text: str) -> Delta:
        reasoning, answer = self._reasoning.feed(text)
        return _delta(reasoning, self._parsed(self._unmarked(answer)))

    def finish(self, stopped: bool = False) -> Delta:
        """``stopped``: the model ended its reply (a call it left open ends too), not a limit."""
        reasoning, held = self._reasoning.finish(), self._held
        self._held = ""
        if not self._calls:
            return _delta(reasoning, Parsed(held))
        return _delta(reasoning, _joined(self._calls.feed(held), self._calls.finish(stopped)))

    def _unmarked(self, answer: str) -> str:
        """``answer`` without the thought's marks, in whatever pieces they come."""
        text = self._held + answer
        for mark in _THOUGHT_MARKS:
            text = text.replace(mark, "")
        hold = held_suffix(text, _THOUGHT_MARKS)
        self._held = text[len(text) - hold :]
        return text[: len(text) - hold]

    def _parsed(self, answer: str) -> Parsed:
        return self._calls.feed(answer) if self._calls else Parsed(answer)


def _joined(first: Parsed, then: Parsed) -> Parsed:
    return Parsed(first.content + then.content, first.calls + then.calls, first.started + then.started)


def _delta(reasoning: str, parsed: Parsed) -> Delta:
    return Delta(reasoning, parsed.content, parsed.started, parsed.calls)


def parse_message(
    text: str, thinking: bool, stopped: bool = False, tools: bool = True, calls_only: bool = False
) -> Delta:
    """A whole completion's parts."""
    stream = AssistantStream(thinking, tools, calls_only)
    return stream.feed(text).then(stream.finish(stopped))
