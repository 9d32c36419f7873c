"""A completion's token counts as OpenAI reports them (``usage``: a finished stream's last entry
carries them). The workers' completions count as they go (completion.py); a request that waited past
DAYZERO_TASK_TIME_LIMIT_S is counted from the tokens it streamed (time_limit.py), by the gateway
(reaper.py) and by a worker that claimed it (waiting.py) alike. Torch-free: the gateway imports it."""

from __future__ import annotations

from collections.abc import Sequence

from .chat.reasoning import ReasoningCount
from .stream_decoder import StreamDecoder
from .tokenizer import IdsOnlyCodec, TextCodec


def usage_counts(prompt_tokens: int, completion_tokens: int, reasoning_tokens: int | None) -> dict:
    """``reasoning_tokens``: thinking mode's (OpenAI's ``completion_tokens_details``); None: not in it."""
    counts: dict = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    if reasoning_tokens is not None:
        counts["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return counts


def streamed_usage(
    codec: TextCodec | IdsOnlyCodec, prompt_tokens: int, streamed: Sequence[int], thinking: bool
) -> dict:
    """The counts of an unfinished request that has streamed ``streamed`` (none of them ended it: no
    EOS it stops at), as its completion would count them."""
    if not thinking:
        return usage_counts(prompt_tokens, len(streamed), None)
    text, reasoning = StreamDecoder(codec), ReasoningCount(thinking)
    for token in streamed:
        reasoning.add(text.push(token))
    return usage_counts(prompt_tokens, len(streamed), reasoning.tokens)
