"""A request's completion: sampling, text deltas, and when it ends (EOS, stop string, length).

Rebuildable from the tokens streamed so far (``generated``), so another worker can take a
request over after a failure; with a seed, the step that emits token ``i`` first (a speculative
round: every draw of it) draws from its own generator (seed, i), so a re-run that steps on from
the same token (``prefill_batch.prefilled_ids``) samples the same continuation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace

import torch

from .completion_text import CompletionText
from .guided import Guide, LexerFilled, allowed_logits
from .sampling import SamplingParams, logprobs_of, sample, sample_rows
from .tokenizer import TextCodec
from .usage import usage_counts


@dataclass(frozen=True, slots=True)
class Step:
    """One generated token and the text it released (may be empty while held back)."""

    token: int
    text: str
    finish_reason: str | None = None  # "stop" (EOS or stop string) | "length" | None
    logprob: float | None = None  # when the request asked for logprobs
    top: tuple[tuple[int, float], ...] = ()  # (token, logprob) of the most likely tokens


class Completion:
    def __init__(
        self,
        codec: TextCodec,
        params: SamplingParams,
        eos_ids: tuple[int, ...],
        prompt_tokens: int,
        limit: int,
        generated: tuple[int, ...] = (),
        thinking: bool = False,
        compiled: Future | None = None,  # the grammar's, held since it was ready (Grammars.compiled)
        prompt_ids: Sequence[int] = (),  # the prompt's: the text reads as it does after them (CompletionText)
    ) -> None:
        self.params, self.eos_ids, self.prompt_tokens, self.limit = params, eos_ids, prompt_tokens, limit
        self.count = 0
        self.thinking = thinking  # a chat in thinking mode: its reasoning tokens are counted
        self.counts: Counter[int] = Counter()  # generated tokens, for the penalties
        self._text = CompletionText(codec, params, thinking, prompt_ids)
        self.guide = Guide(codec.grammars, params.grammar, compiled) if params.grammar is not None else None
        self.held: torch.Tensor | None = None  # [V]: a step's logits, while its grammar takes a fresh compile
        for token in generated:  # replay: rebuild the text and stop-string state, output discarded
            try:
                self.accept(token)
            except LexerFilled:  # (its guide keeps the token for a fresh compile: ``waiting``, ``resume``)
                self.accept(token)

    @property
    def waiting(self) -> bool:
        """Whether its grammar waits for a fresh compile (its lexer filled: a step's, ``held``, or a
        replay's): it samples nothing till ``resume``."""
        return self.guide is not None and self.guide.filled is not None

    def usage(self) -> dict:
        """The token counts a finished stream's last entry carries; thinking mode adds OpenAI's
        ``completion_tokens_details.reasoning_tokens``."""
        return usage_counts(self.prompt_tokens, self.count, self._text.reasoning.tokens if self.thinking else None)

    def generator(self) -> torch.Generator | None:
        """The generator of token ``count`` (seed, count), or None without a seed."""
        if self.params.seed is None:
            return None
        return torch.Generator().manual_seed(self.params.seed * 1_000_003 + self.count)

    def sample(self, logits: torch.Tensor) -> int:
        return sample(logits, self.params, self.generator(), self.counts)

    def remaining(self) -> int:
        """Tokens it may still emit before ``max_tokens`` or the context limit ends it."""
        return min(self.params.max_tokens - self.count, self.limit - self.prompt_tokens - self.count)

    def next(self, logits: torch.Tensor) -> Step:
        """Sample from ``logits`` [V] (within the grammar, if any) and accept the token; raises
        ``LexerFilled`` while ``waiting`` (``resume`` first)."""
        if self.waiting:
            raise self.guide.filled
        step = next_steps([self], logits[None])[0]
        if isinstance(step, Exception):
            raise step
        return step

    def resume(self, compiled: Future) -> Step | None:
        """The step its full lexer held (``held``: ``LexerFilled``), sampled from the same logits on
        ``compiled``, a fresh compile of its grammar the caller saw ready and holds (``Guide.renew``;
        None with no step held: a replay's, which steps again): the position the model stepped is not
        lost, and the token it was forced to (the end an empty mask allows) never streamed. Raises as
        ``next`` does."""
        self.guide.renew(compiled, held=self.held is not None)
        if self.held is None:
            return None
        logits, self.held = self.held, None
        return self.next(logits)

    def emit(self, token: int, logits: torch.Tensor) -> Step:
        """Accept ``token`` and attach its logprobs (from the raw ``logits`` [V]) when asked for."""
        step = self.accept(token)
        if self.params.logprobs is None:
            return step
        (logprob, top), *_ = logprobs_of(logits[None], [step.token], self.params.logprobs)
        return replace(step, logprob=logprob, top=top)

    def accept(self, token: int) -> Step:
        if self.guide is not None:  # (first: a token its grammar fails on is not counted, never streamed)
            self.guide.accept(token)
        self.count += 1
        self.counts[token] += 1
        if token in self.eos_ids and not self.params.ignore_eos:
            return Step(token, self.end()[0], "stop")
        released, stopped = self._text.push(token)
        if stopped:
            return Step(token, released, "stop")
        if self.count >= self.params.max_tokens or self.prompt_tokens + self.count >= self.limit:
            tail, stopped = self.end()
            return Step(token, released + tail, "stop" if stopped else "length")
        return Step(token, released)

    def end(self) -> tuple[str, bool]:
        """The text held back, at an end (``CompletionText.end``), and whether a stop string ended it."""
        return self._text.end()

    def text_mark(self) -> tuple[tuple, ...]:
        """Its text's state, for ``end_at`` (``CompletionText.mark``)."""
        return self._text.mark()

    def end_at(self, mark: tuple[tuple, ...]) -> tuple[str, bool]:
        """``end`` where ``mark`` was taken: the tokens accepted since are given up (their text too)."""
        self._text.rewind(mark)
        return self._text.end()


def next_steps(completions: list[Completion], logits: torch.Tensor) -> list[Step | Exception]:
    """One step of a batch: ``logits`` [B, V], row ``i`` for ``completions[i]``; the grammars' masks
    are computed and applied for the whole batch at once. A row whose own sampling raises gives that
    exception instead of a step: its request fails alone and the rest of the batch goes on."""
    eos = completions[0].eos_ids[0] if completions[0].eos_ids else 0
    allowed = allowed_logits(logits, [c.guide for c in completions], eos)
    try:  # every row sampled together (the grammars' masks in ``allowed``)...
        generators = [c.generator() for c in completions]
        tokens = sample_rows(allowed, [c.params for c in completions], generators, [c.counts for c in completions])
    except Exception:  # noqa: BLE001 - ...unless a row cannot be: then each alone, so only it fails
        tokens = [None] * len(completions)
    steps: list[Step | Exception] = []
    for i, c in enumerate(completions):
        try:
            token = c.sample(allowed[i]) if tokens[i] is None else tokens[i]
            steps.append(c.emit(token, logits[i]))  # accepted, its logprobs from the unmasked logits
        except LexerFilled as exc:  # (its state as before the step: ``resume`` samples the row again)
            c.held = logits[i].clone()  # (a view would hold the batch's logits)
            steps.append(exc)
        except Exception as exc:  # noqa: BLE001 - handed to the caller, which settles that request
            steps.append(exc)
    return steps
