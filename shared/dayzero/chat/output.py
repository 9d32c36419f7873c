"""An assistant's raw text -> OpenAI's message parts: reasoning_content, content, tool calls."""

from __future__ import annotations

from dataclasses import dataclass, field

from .dsml import Parsed, ToolCall, ToolCallStream, held_suffix
from .reasoning import ReasoningSplitter
from .tokens import DSML, END_THINK, THINK

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
    in content"); they are dropped from the content, as a stray DSML tag is, and the text around them
    kept. Calls are read first, from the text as written: text joined across a dropped mark is never
    read as DSML (``<｜DS</think>ML｜`` is text, as the auto grammar, which lets free text hold the
    mark, saw it; it was read as a block, a strict tool's call off its schema), and the marker it
    spells is dropped too."""

    def __init__(self, thinking: bool, tools: bool = True, calls_only: bool = False) -> None:
        self._reasoning = ReasoningSplitter(thinking)
        self._calls = ToolCallStream(calls_only) if tools else None
        # what the content never holds: the thought's marks; with tools, the DSML marker that text
        # joined across a dropped mark may spell (the content the calls left holds none)
        self._dropped = _THOUGHT_MARKS + ((DSML,) if tools else ())
        self._held = ""  # the content's end that may grow into one of them

    def feed(self, text: str) -> Delta:
        reasoning, answer = self._reasoning.feed(text)
        parsed = self._calls.feed(answer) if self._calls else Parsed(answer)
        return _delta(reasoning, parsed, self._unmarked(parsed.content))

    def finish(self, stopped: bool = False) -> Delta:
        """``stopped``: the model ended its reply (a call it left open ends too), not a limit."""
        reasoning = self._reasoning.finish()
        parsed = self._calls.finish(stopped) if self._calls else Parsed()
        content = self._unmarked(parsed.content) + self._held  # (an end that never became a mark is text)
        self._held = ""
        return _delta(reasoning, parsed, content)

    def _unmarked(self, content: str) -> str:
        """``content`` without the thought's marks (nor a marker they split), in whatever pieces they come."""
        text = self._held + content
        while any(mark in text for mark in self._dropped):  # (each removal may join another)
            for mark in self._dropped:
                text = text.replace(mark, "")
        if hold := held_suffix(text, self._dropped):  # (and a marker's start that a mark's would join)
            hold += held_suffix(text[: len(text) - hold], self._dropped[2:])
        self._held = text[len(text) - hold :]
        return text[: len(text) - hold]


def _delta(reasoning: str, parsed: Parsed, content: str) -> Delta:
    return Delta(reasoning, content, parsed.started, parsed.calls)


def parse_message(
    text: str, thinking: bool, stopped: bool = False, tools: bool = True, calls_only: bool = False
) -> Delta:
    """A whole completion's parts."""
    stream = AssistantStream(thinking, tools, calls_only)
    return stream.feed(text).then(stream.finish(stopped))
