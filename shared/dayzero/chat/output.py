"""An assistant's raw text -> OpenAI's message parts: reasoning_content, content, tool calls."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .dsml import Parsed, ToolCall, ToolCallStream
from .reasoning import ReasoningSplitter
from .tokens import DSML, END_THINK, THINK

_THOUGHT_MARKS = (THINK, END_THINK)
HELD_MOST = 4  # a stream holds marks' starts nested this deep at most ("<<<<": the longest's length each)


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
    into another): the end that may still grow into one, marks' starts nested ("<<think>think>"), is
    held till the next piece, and released as text by the ``last``; at most its last ``HELD_MOST``
    characters (whole starts): a longer run of starts ("<" x 1000, a model stuck on it) is released
    but for those (it streamed nothing till it stopped). A mark that then completes across
    released text loses only its unreleased part: the text out never holds one, streamed or whole.

    Every mark opens with a character it holds nowhere else but its last (``<``, ``｜``), so a held
    end splits at those openers into marks' starts one way only: a piece costs its own length.
    """

    def __init__(self, dropped: tuple[str, ...]) -> None:
        self._dropped = dropped
        self._openers = {mark[0] for mark in dropped}
        self._closer_at = re.compile("[" + re.escape("".join({mark[-1] for mark in dropped})) + "]")
        self._mark_at = re.compile("|".join(map(re.escape, dropped)))
        self._longest = max(map(len, dropped))
        self._most = HELD_MOST * (self._longest - 1)  # held: marks' starts nested this deep
        self._held: list[str] = []  # the text's end that a mark may still complete in
        self._out = 0  # held[:_out] is released already (starts released past the cap)

    def feed(self, piece: str, last: bool = False) -> str:
        held = self._held
        if not held and not any(opener in piece for opener in self._openers):
            return piece
        if not held and not any(mark in piece for mark in self._dropped):  # nothing to remove: kept as it is
            return self._release(piece, 0, 0, last)  # (a body's code full of "<": 200x, char by char)
        out = floor = self._out  # removals stop at floor: held[:floor] is released (or will be)
        known = len(held)  # held[:known] is marks' starts (what earlier pieces left, and what removals leave)
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
                if len(held) - 1 - self._most > floor:  # released before it came (never a part of it)
                    floor = max(floor, self._release_point(held, len(held) - 1, known)[1])
                del held[max(len(held) - len(mark), floor) :]
                known, joined = min(known, len(held)), walked
        held.extend(piece[walked:])
        return "".join(held[out:floor]) + self._release(held, floor, known, last)

    def _release(self, text: list[str] | str, released: int, known: int, last: bool) -> str:
        """What ``text`` (the held text and all after it) releases from ``released`` on: what no mark
        can complete in any more (all of it when ``last``). Held after it: marks' starts,
        ``HELD_MOST`` starts' length at most, after those of their characters a mark may still
        complete across (released). ``text[:known]`` is marks' starts."""
        chain, cut = (len(text), len(text)) if last else self._release_point(text, len(text), known)
        cut = max(cut, released)
        kept_from = min(max(chain, cut - (self._longest - 1)), cut)
        self._held, self._out = list(text[kept_from:]), cut - kept_from
        return text[released:cut] if isinstance(text, str) else "".join(text[released:cut])

    def _release_point(self, text: list[str] | str, end: int, known: int) -> tuple[int, int]:
        """(where the marks' starts that end ``text[:end]`` begin, at or below a floor the caller
        needs no lower; where the last ``_most`` characters of them begin, whole starts).
        ``text[:known]`` is marks' starts: a walk back that reaches it needs to go no further."""
        floor = max(end - self._most - self._longest, 0)
        chain = end
        while chain > floor:
            if chain <= known:  # (all before it is starts too)
                chain = 0
                break
            begin = next(
                (i for i in range(chain - 1, max(chain - self._longest, -1), -1) if text[i] in self._openers), None
            )
            if begin is None or not any(m.startswith("".join(text[begin:chain])) for m in self._dropped):
                break
            chain = begin
        cut = next((i for i in range(max(chain, end - self._most), end) if text[i] in self._openers), end)
        return chain, cut

    def _completed(self, held: list[str]) -> str | None:
        return next((m for m in self._dropped if len(held) >= len(m) and "".join(held[-len(m) :]) == m), None)


def _delta(reasoning: str, parsed: Parsed, content: str) -> Delta:
    return Delta(reasoning, content, parsed.started, parsed.calls)


def parse_message(
    text: str, thinking: bool, stopped: bool = False, tools: bool = True, calls_only: bool = False
) -> Delta:
    """A whole completion's parts."""
    stream = AssistantStream(thinking, tools, calls_only)
    return stream.feed(text).then(stream.finish(stopped))
