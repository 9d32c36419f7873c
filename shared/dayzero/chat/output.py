"""An assistant's raw text -> OpenAI's message parts: reasoning_content, content, tool calls."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .dsml import Parsed, ToolCall, ToolCallStream
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
    them again after its thought), nor does the thought (a ``<think>`` within it): DeepSeek's decoder
    refuses such a reply ("Unexpected special token in content"); they are dropped, as a stray DSML
    tag is, and the text around them kept (in a stream too: the thought's end is released as it
    ends, before the answer). Calls are read first, from the text as written: text joined across a dropped mark is never
    read as DSML (``<｜DS</think>ML｜`` is text, as the auto grammar, which lets free text hold the
    mark, saw it; it was read as a block, a strict tool's call off its schema), and the marker it
    spells is dropped too."""

    def __init__(self, thinking: bool, tools: bool = True, calls_only: bool = False) -> None:
        self._reasoning = ReasoningSplitter(thinking)
        self._calls = ToolCallStream(calls_only) if tools else None
        self._thought = _Unmarked(_THOUGHT_MARKS)
        # with tools, the content never holds the DSML marker that text joined across a dropped mark
        # may spell either (the content the calls left holds none)
        self._content = _Unmarked(_THOUGHT_MARKS + ((DSML,) if tools else ()))

    def feed(self, text: str) -> Delta:
        reasoning, answer = self._reasoning.feed(text)
        reasoning = self._thought.feed(reasoning, last=not self._reasoning.thinking)  # (its end released)
        parsed = self._calls.feed(answer) if self._calls else Parsed(answer)
        return _delta(reasoning, parsed, self._content.feed(parsed.content))

    def finish(self, stopped: bool = False) -> Delta:
        """``stopped``: the model ended its reply (a call it left open ends too), not a limit."""
        reasoning = self._thought.feed(self._reasoning.finish(), last=True)
        parsed = self._calls.finish(stopped) if self._calls else Parsed()
        return _delta(reasoning, parsed, self._content.feed(parsed.content, last=True))


class _Unmarked:
    """A text without ``dropped`` (the thought's marks, and any marker their removal may spell), in
    whatever pieces they come, removed as they complete (each removal may join the text around it
    into another): the end that may still grow into one, however deep marks' starts nest in it
    ("<<think>think>" and so on), is held till the next piece, and released as text by the ``last``.

    Every mark opens with a character it holds nowhere else but its last (``<``, ``｜``), so a held
    end splits at those openers into marks' starts one way only, and the start of what was held
    before a piece needs no second look after it: a piece costs its own length, never the held run's.
    """

    def __init__(self, dropped: tuple[str, ...]) -> None:
        self._dropped = dropped
        self._openers = {mark[0] for mark in dropped}
        self._closer_at = re.compile("[" + re.escape("".join({mark[-1] for mark in dropped})) + "]")
        self._mark_at = re.compile("|".join(map(re.escape, dropped)))
        self._longest = max(map(len, dropped))
        self._held: list[str] = []  # marks' starts, each at an opener

    def feed(self, piece: str, last: bool = False) -> str:
        held = self._held
        if not held and not any(opener in piece for opener in self._openers):
            return piece
        if not held and not any(mark in piece for mark in self._dropped):  # nothing to remove: kept as it is
            kept = 0 if last else self._marks_start(piece, 0)  # (a body's code full of "<": 200x, char by char)
            held.extend(piece[len(piece) - kept :])
            return piece[: len(piece) - kept]
        unchanged = len(held)  # held[:unchanged] is what earlier pieces left: marks' starts already
        walked = joined = 0  # (piece[joined:] follows what is held unbroken: no removal since)
        while True:  # to each place a mark completes, the text before it taken whole (it was char by char)
            # a mark that starts in what is held ends within a mark's length of the join; past that,
            # only a mark as the piece writes it can complete
            near = self._closer_at.search(piece, walked, joined + self._longest - 1)
            found = near or self._mark_at.search(piece, joined)
            if found is None:
                break
            held.extend(piece[walked : found.end()])
            walked = found.end()
            if mark := self._completed(held):
                del held[-len(mark) :]
                unchanged, joined = min(unchanged, len(held)), walked
        held.extend(piece[walked:])
        kept = 0 if last else self._marks_start(held, unchanged)
        released = "".join(held[: len(held) - kept])
        del held[: len(held) - kept]
        return released

    def _completed(self, held: list[str]) -> str | None:
        return next((m for m in self._dropped if len(held) >= len(m) and "".join(held[-len(m) :]) == m), None)

    def _marks_start(self, text: list[str] | str, unchanged: int) -> int:
        """Length of the text's end that is marks' starts, one after another (``text[:unchanged]`` is)."""
        end = len(text)
        while end > unchanged:
            begin = next(
                (i for i in range(end - 1, max(end - self._longest, -1), -1) if text[i] in self._openers), None
            )
            if begin is None or not any(m.startswith("".join(text[begin:end])) for m in self._dropped):
                return len(text) - end
            end = begin
        return len(text)


def _delta(reasoning: str, parsed: Parsed, content: str) -> Delta:
    return Delta(reasoning, content, parsed.started, parsed.calls)


def parse_message(
    text: str, thinking: bool, stopped: bool = False, tools: bool = True, calls_only: bool = False
) -> Delta:
    """A whole completion's parts."""
    stream = AssistantStream(thinking, tools, calls_only)
    return stream.feed(text).then(stream.finish(stopped))
