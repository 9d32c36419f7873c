"""A completion's text as its tokens come: the decoder's deltas (stream_decoder.py), thinking
mode's split (no stop string matches in the thought) and the stop strings, and the text an end
releases. Torch-free: the gateway's reaper replays it over the tokens a request streamed to end one
that waited past the time limit as its completion would have ended (time_limit.py)."""

from __future__ import annotations

from collections.abc import Sequence

from .chat.reasoning import ReasoningCount
from .ids_only_codec import IdsOnlyCodec
from .lead_space import prompt_lead
from .params import SamplingParams
from .stream_decoder import StreamDecoder
from .tokenizer import TextCodec


class StopMatcher:
    """Releases text while holding back any suffix that could still become a stop string.

    Stop strings match the reply's text up to the first ``bound`` (a tool-call block's opening:
    its markup and calls are no text of the reply's), none after it. Text that may begin a bound is
    held until the next characters decide, and a stop string that reaches into a bound matches not."""

    def __init__(self, stops: tuple[str, ...], bounds: tuple[str, ...] = ()) -> None:
        self.stops, self._bounds = stops, bounds
        self._pending = ""
        self._bounded = False  # a bound was reached: no stop string matches from there on

    def feed(self, delta: str) -> tuple[str, bool]:
        text = self._pending + delta
        if self._bounded:
            self._pending = ""
            return text, False
        at = min((i for i in (text.find(b) for b in self._bounds) if i >= 0), default=len(text))
        undecided = 0 if at < len(text) else max((self._held(text, b) for b in self._bounds), default=0)
        free = text[: at - undecided]  # the text stop strings may match in
        hits = [i for i in (free.find(s) for s in self.stops) if i >= 0]
        if hits:
            self._pending = ""
            return text[: min(hits)], True
        if at < len(text):
            self._pending, self._bounded = "", True
            return text, False
        hold = max((self._held(free, s) for s in self.stops), default=0) + undecided
        self._pending = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold], False

    def mark(self) -> tuple[str, bool]:
        """Its state, for ``rewind``."""
        return self._pending, self._bounded

    def rewind(self, mark: tuple[str, bool]) -> None:
        """Back to the state ``mark`` took."""
        self._pending, self._bounded = mark

    @staticmethod
    def _held(text: str, stop: str) -> int:
        """The length of the longest end of ``text`` that ``stop`` begins with, shorter than it:
        only the places where its first character appears are tried."""
        at = text.find(stop[0], max(0, len(text) - len(stop) + 1))
        while at >= 0:
            if stop.startswith(text[at:]):
                return len(text) - at
            at = text.find(stop[0], at + 1)
        return 0

    def flush(self) -> tuple[str, bool]:
        """The text held back, at the end: up to a stop string in it (one a bound might have
        followed), and whether there was one."""
        text, self._pending = self._pending, ""
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        return (text[: min(hits)], True) if hits else (text, False)


REPLAY_CHUNK = 256  # tokens a replay pushes at once (one by one, a long stream held the GIL ~20 us a token)


class CompletionText:
    """The text a completion's tokens release: each token's delta, held back while it may still be
    a character's first bytes, a thought's end or a stop string's start; and whether a stop string
    ended it."""

    def __init__(
        self, codec: TextCodec | IdsOnlyCodec, params: SamplingParams, thinking: bool, prompt: Sequence[int] = ()
    ) -> None:
        """``prompt``: the ids the completion follows; its text reads as it does after them (a
        sentencepiece decoder keeps its lead space; a character they cut short is its own once its
        tokens complete it: ``lead_space.prompt_lead``)."""
        self._decoder = StreamDecoder(codec, *prompt_lead(codec, prompt))
        self._stops = StopMatcher(params.stop, params.stop_bounds)
        self.reasoning = ReasoningCount(thinking)  # its reasoning tokens (thinking mode), as they come
        # the stop strings' probe of a held run's text (``push``): their state after it, and what it released
        self._probe: tuple[tuple[str, bool], list[str]] = (self._stops.mark(), [])

    @classmethod
    def replayed(
        cls,
        codec: TextCodec | IdsOnlyCodec,
        params: SamplingParams,
        thinking: bool,
        ids: Sequence[int],
        prompt: Sequence[int] = (),
    ) -> CompletionText:
        """The text state after ``ids`` (following ``prompt``), none of which ended it (what they
        released is out already): ``REPLAY_CHUNK`` of them at a time (one decode, one stop-string
        match), as their pushes one by one would leave it (``_replay``)."""
        text = cls(codec, params, thinking, prompt)
        for at in range(0, len(ids), REPLAY_CHUNK):
            text._replay(list(ids[at : at + REPLAY_CHUNK]))
        return text

    def _replay(self, ids: list[int]) -> None:
        """Push ``ids`` at once where that leaves the state their pushes one by one leave: their text
        all settled at their end or all in a run of byte tokens held before them
        (``StreamDecoder.push_all``, ``settled_since``), and no thought ending among them (each
        token up to the one whose text ends it is a reasoning token); else each half so."""
        if len(ids) == 1:
            self.push(ids[0])
            return
        mark, thinking = self.mark(), self.reasoning.thinking
        self._release(self._decoder.push_all(ids), len(ids))
        if self._decoder.settled_since(mark[0]) and (self.reasoning.thinking or not thinking):
            return
        self.rewind(mark)
        self._replay(ids[: len(ids) // 2])
        self._replay(ids[len(ids) // 2 :])

    def push(self, token: int) -> tuple[str, bool]:
        """What one more token releases, and whether a stop string ended it there: one the text it
        holds completes (a byte-fallback tokenizer's run of byte tokens, held till it ends) ends it
        on this token, as the text of its ids up to here holds it."""
        delta = self._decoder.push(token)
        released, stopped = self._release(delta)
        if stopped or delta or not self._stops.stops or self.reasoning.thinking:
            return released, stopped
        ending, whole = self._decoder.ending()
        if not ending:
            return released, False
        stops = self._stops.mark()
        if whole:  # (a probe of the run's text: the stop strings' state after it, and what it released)
            self._probe = stops, []
        else:  # (its text goes on: the probe too)
            self._stops.rewind(self._probe[0])
        out, stopped = self._stops.feed(ending)
        if stopped:
            return released + "".join(self._probe[1]) + out, True
        self._probe[1].append(out)
        self._probe = self._stops.mark(), self._probe[1]
        self._stops.rewind(stops)  # (its text is still held)
        return released, False

    def mark(self) -> tuple[tuple, ...]:
        """Its state, for ``rewind``: a few values, no copies (the decode loop takes one each step)."""
        return self._decoder.mark(), self._stops.mark(), self.reasoning.mark()

    def rewind(self, mark: tuple[tuple, ...]) -> None:
        """Back to the state ``mark`` took: the ids pushed since are dropped."""
        decoder, stops, reasoning = mark
        self._decoder.rewind(decoder)
        self._stops.rewind(stops)
        self.reasoning.rewind(reasoning)

    def end(self) -> tuple[str, bool]:
        """The text held back, at an end (EOS, a token limit, the time limit's): the decoder's (a
        character cut short: U+FFFD), through the thought's split and the stop strings, then what
        the stop strings held; and whether a stop string ended it."""
        released, stopped = self._release(self._decoder.flush(), tokens=0)
        if stopped:
            return released, True
        tail, stopped = self._stops.flush()
        return released + tail, stopped

    def _release(self, text: str, tokens: int = 1) -> tuple[str, bool]:
        """What ``text``, released by ``tokens`` tokens, streams, and whether a stop string ended it."""
        answer = self.reasoning.add(text, tokens)  # None: still in the thought, where no stop string matches
        if answer is None:
            return text, False
        # the stop strings see the answer from its start: a call block's opening bounds them
        answered, stopped = self._stops.feed(answer)
        earlier = len(answer) - len(text)  # > 0: the answer began in texts released as the thought's
        return text[: max(0, -earlier)] + answered[max(0, earlier) :], stopped
