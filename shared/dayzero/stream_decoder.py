"""Text released as a completion's ids grow: deltas that never cut a UTF-8 character."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .tokenizer import TextCodec


class StreamDecoder:
    """Turns a growing list of ids into text deltas, holding back incomplete UTF-8 (a character
    cut short, not a stray byte: that one is U+FFFD whatever follows).

    Each push decodes only the ids since the last text it released, after those of the release
    before (a decoder may render a token by its neighbours, e.g. a word's leading space): the cost
    per token stays flat however long the output grows."""

    def __init__(self, codec: TextCodec) -> None:
        self._codec = codec
        self._ids: list[int] = []
        self._context = 0  # ids[_context:_released] decoded as the context of what follows
        self._released = 0  # the ids up to here are out as text

    def push(self, token: int) -> str:
        self._ids.append(token)
        before = self._codec.decode(self._ids[self._context : self._released])
        text = self._codec.decode(self._ids[self._context :])
        cut = text.endswith("\ufffd") and self._codec.cut_short(self._ids[self._released :])
        if len(text) <= len(before) or cut:  # a multi-byte character is not complete yet
            return ""
        self._context, self._released = self._released, len(self._ids)
        return text[len(before) :]
