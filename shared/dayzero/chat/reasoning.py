"""Thinking mode's output: the text before ``</think>`` is the reasoning, the rest the answer.

A tool-call block also ends the reasoning (a model that starts calling without closing its
thought still gets its calls parsed), with or without the blank line V4 writes before one: the
answer's parser (dsml) reads a block either way, and so does the grammar of tool_choice "auto"
with a strict tool (auto_grammar), which holds the thought too. Streaming-safe: an end that could
still grow into ``</think>`` or a block is held back until the next text decides.
"""

from __future__ import annotations

from .dsml import BLOCK_OPEN, held_suffix
from .tokens import END_THINK

_ENDS = (END_THINK, "\n\n" + BLOCK_OPEN, BLOCK_OPEN)  # (the blank line before a block is the block's)


class ReasoningSplitter:
    def __init__(self, thinking: bool) -> None:
        self.thinking = thinking  # still inside the reasoning
        self._held = ""

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, answer) released by ``text``."""
        if not self.thinking:
            return "", text
        text = self._held + text
        found = [(at, end) for end in _ENDS if (at := text.find(end)) >= 0]
        if found:
            at, end = min(found)
            self.thinking, self._held = False, ""
            rest = text[at + len(END_THINK) :] if end == END_THINK else text[at:]
            return text[:at], rest
        hold = held_suffix(text, _ENDS)
        self._held = text[len(text) - hold :]
        return text[: len(text) - hold], ""

    def finish(self) -> str:
        """Reasoning held at the end of the text (it was cut before ``</think>``)."""
        held, self._held = self._held, ""
        return held


class ReasoningCount:
    """A thinking-mode completion's reasoning tokens, counted as their texts come: each token up to
    the one whose text ends the thought (``</think>`` or a call block); none outside thinking mode."""

    def __init__(self, thinking: bool) -> None:
        self.tokens = 0
        self._thought = ReasoningSplitter(thinking)

    @property
    def thinking(self) -> bool:
        """Still inside the thought (thinking mode, its end not reached yet)."""
        return self._thought.thinking

    def mark(self) -> tuple[int, bool, str]:
        """Its state, for ``rewind``."""
        return self.tokens, self._thought.thinking, self._thought._held

    def rewind(self, mark: tuple[int, bool, str]) -> None:
        """Back to the state ``mark`` took."""
        self.tokens, self._thought.thinking, self._thought._held = mark

    def add(self, text: str, tokens: int = 1) -> str | None:
        """``tokens`` more tokens (0: the text an end releases, an EOS's held characters), which
        released ``text``: the answer it begins or goes on with (``text`` once the thought is over,
        or outside thinking mode), None while the thought goes on. The answer may begin before
        ``text``: a call block that ends the thought is found once its opening is whole, in texts of
        earlier tokens too (released as the thought's meanwhile)."""
        if not self._thought.thinking:
            return text
        self.tokens += tokens
        _, answer = self._thought.feed(text)
        return None if self._thought.thinking else answer
