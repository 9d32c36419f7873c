"""Text released as a completion's ids grow: deltas that never cut a UTF-8 character."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .ids_only_codec import IdsOnlyCodec
    from .tokenizer import TextCodec


NO_RUN = ((-1, -1, -1), 0, 0)  # ``_run`` before an open run's text is read


class StreamDecoder:
    """Turns a growing list of ids into text deltas, holding back incomplete UTF-8 (a character
    cut short, not a stray byte: that one is U+FFFD whatever follows), and a byte-fallback
    tokenizer's run of byte tokens while its bytes may still be UTF-8 (``TextCodec.open_run``), till
    a later token or ``flush`` at the end. What precedes a cut character streams at once: a run of
    lead bytes, each ending the one before, streams all but its last (and a run of byte tokens
    that is not UTF-8 all but a cut character: it is one U+FFFD a byte, whatever follows).

    Each push decodes only the ids since the last text it released, after those of the release
    before (a decoder may render a token by its neighbours, e.g. a word's leading space): the cost
    per token stays flat however long the output grows."""

    def __init__(self, codec: TextCodec | IdsOnlyCodec, after: Sequence[int] = (), cut: int = 0) -> None:
        """``after``: the ids whose text its own follows, never released (the prompt's last:
        ``lead_space.prompt_lead``), decoded as the context of its first; ``cut``: the characters
        that end their text where it ends in a character cut short (U+FFFD, one a byte in a run of
        byte tokens), which its own ids may complete: that character is then theirs."""
        self._codec = codec
        self._ids: list[int] = list(after)
        self._context = 0  # ids[_context:_released] decoded as the context of what follows
        self._released = len(after)  # the ids up to here are out as text
        self._cut = cut  # characters ending the text of ids[_context:_released] a character cut short
        self._shown = 0  # characters of the text of ids[_released:] out already (before a cut character)
        self._open = 0  # ids[_context:] up to here end in an open run of byte tokens (TextCodec.open_run)
        # where ``ending`` last read an open run's text to: ((_context, _released, _shown) then, start,
        # upto): ids[:upto] end where a character does, and so do ids[:start], before it (its decode from
        # there on gives what later ids add)
        self._run: tuple[tuple[int, int, int], int, int] = NO_RUN

    def push(self, token: int) -> str:
        return self.push_all([token])

    def push_all(self, ids: list[int]) -> str:
        """What pushing ``ids`` releases, in one: where it is ``settled_since`` the mark before them,
        the state is that of pushing them one by one (a replay's way through a long stream: one
        decode of them); where it is not, what it holds may start earlier (``rewind`` it)."""
        if not self._codec.has_tokenizer:  # (an ids-only codec's: no text, so nothing held, no id kept)
            return ""
        self._ids.extend(ids)
        pending = self._ids[self._context :]
        if self._codec.open_run(pending, self._open):  # (decoded once it ends: a run decodes whole)
            self._open = len(pending)
            return ""
        self._open = 0
        held = self._held()
        if not held:  # (no text yet: a special token left out)
            return ""
        end = len(held) - self._codec.unsettled(self._ids[self._released :], held)
        delta = held[self._shown : end]
        if end < len(held):  # a multi-byte character is not complete yet
            self._shown += len(delta)
            return delta
        # (a run of byte tokens not UTF-8, settled: its later bytes decode from where it breaks)
        broken = self._codec.run_break(pending)
        self._context = self._context + broken if broken < len(pending) else self._released
        self._released, self._shown, self._cut = len(self._ids), 0, 0
        return delta

    def settled_since(self, mark: tuple[int, ...]) -> bool:
        """Whether the pushes one by one of the ids since ``mark`` leave the state ``push_all`` left:
        none of their text held back (out, or no text yet: special tokens left out, an ids-only
        codec's), or all of them going on with the run of byte tokens open at ``mark`` (each push
        held all of it: a long run's replay is not split down to single pushes)."""
        if self._open:
            return mark[4] > 0 and self._codec.in_run(self._ids[mark[0] :])
        return self._released == len(self._ids) or not self._held()

    def mark(self) -> tuple[int, ...]:
        """Its state, for ``rewind``."""
        return len(self._ids), self._context, self._released, self._shown, self._open, self._cut

    def rewind(self, mark: tuple[int, ...]) -> None:
        """Back to the state ``mark`` took: the ids pushed since are dropped."""
        count, self._context, self._released, self._shown, self._open, self._cut = mark
        del self._ids[count:]
        self._run = NO_RUN

    def ending(self) -> tuple[str, bool]:
        """What ``flush`` would release were the ids to end here, as (text, whole): all of it (whole)
        where this is the first call to read the open run's text (since its release or a ``rewind``),
        else what it adds to the text the calls before returned; "" while a later token may still
        change its end (a character cut short): a stop string in it ends the completion here (the text
        of a run of byte tokens, held while a later byte may make it U+FFFD each). Only an open run's
        text is ever settled yet held: none else is decoded (a byte-level tokenizer's cut character, a
        special token, is "" at no cost); and a run's only from the character before its last
        (``_run``): a call costs no more however long the run grows, nor does what it returns."""
        if not self._open:
            return "", True
        key = (self._context, self._released, self._shown)
        known, start, upto = self._run
        if known == key:  # (a valid run's UTF-8 splits where a character begins: its text is its parts')
            text = self._codec.decode(self._ids[start:])[len(self._codec.decode(self._ids[start:upto])) :]
            # (not past left-out tokens alone: a decode from there would strip the next byte's space as a lead space)
            start = upto if any(map(self._codec.shown, self._ids[upto:])) else start
        else:  # (a run opened since)
            start, text = self._context, self._held()[self._shown :]
        if not text or self._codec.unsettled(self._ids[start:], text):
            return "", known != key
        self._run = key, start, len(self._ids)
        return text, known != key

    def flush(self) -> str:
        """The text held back, at the end: a character still cut short is U+FFFD, as decoding the
        ids whole gives it (and Python's UTF-8 decoder with errors="replace" at its final byte)."""
        held = self._held()
        shown, self._shown = self._shown, 0
        self._context = self._released = len(self._ids)
        self._open = self._cut = 0
        return held[shown:]

    def _held(self) -> str:
        """The text of ``ids[_released:]``, decoded after the release before it (``_shown`` of it out
        already, before a cut character): what it adds to that text. Where it rewrites that text (the
        prompt's end, ``after``), what they decode to in it: the character the prompt cut short
        (``_cut``) that they complete; or one U+FFFD a byte of theirs where they turn a run of byte
        tokens from the prompt's UTF-8 into bytes that are not (transformers' decode of both turns the
        prompt's bytes too, one U+FFFD each: no text that follows the prompt's can match it)."""
        before = self._codec.decode(self._ids[self._context : self._released])
        text = self._codec.decode(self._ids[self._context :])
        if text.startswith(before):
            return text[len(before) :]
        if self._cut:
            return text[len(before) - self._cut :]
        return self._codec.decode(self._ids[self._released :])
