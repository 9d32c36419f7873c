"""DAYZERO_TASK_TIME_LIMIT_S: how a request still unfinished that long after its admission ends,
wherever it is: generating (decode_loop.py), claimed and waiting for blocks (waiting.py), or waiting
in a stage's queue or as a handoff no decode worker has taken (reaper.py: no worker may ever take it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..completion_text import CompletionText
from ..ids_only_codec import IdsOnlyCodec
from ..tokenizer import TextCodec
from ..usage import usage_counts
from . import redis_clock as clock
from .messages import GenerationRequest

OVERLOADED = "overloaded"  # the error code of a request that found no room in time: a 503 (gateway/outcome.py)


@dataclass(frozen=True, slots=True)
class LimitEnd:
    """What ``Lifecycle.settle`` records for a request past the limit, at ``index`` (its stream's end)."""

    reason: str
    index: int
    message: str = ""
    usage: dict | None = None
    code: str = ""
    text: str = ""  # what its completion held back (a character cut short: U+FFFD; a stop string's start)


def overdue(created: float, limit_s: float) -> bool:
    """Admitted (at ``created``, Redis's unix time: redis_clock.py) longer ago than ``limit_s``."""
    return created < clock.now() - limit_s


def past_limit(
    codec: TextCodec | IdsOnlyCodec, request: GenerationRequest, streamed: Sequence[int], limit_s: float
) -> LimitEnd:
    """The end of ``request``, waiting (not generating) past the limit, whose stream holds the tokens
    ``streamed`` (read from it, not from a job's own count: a token whose append landed though Redis's
    answer was lost is its client's too): it goes after them.

    One that has streamed tokens ends as a token limit would, its text kept and ended as its
    completion's end would end it (``CompletionText.end``: the character cut short it held back as
    U+FFFD, the stop strings' held text, finish reason "stop" where a stop string ends in it, else
    "length"), its usage counted from them as its completion would count them (thinking mode's
    reasoning tokens too) (an error would lose a non-streamed answer's text and make OpenAI's
    clients run it all again). One that has streamed none ends with a 503 ``overloaded`` (a
    "length" without text would say it had run): its client may retry it when there is room."""
    if streamed:
        text = CompletionText.replayed(codec, request.sampling, request.thinking, streamed, request.prompt_ids)
        ending, stopped = text.end()
        reasoning = text.reasoning.tokens if request.thinking else None
        usage = usage_counts(len(request.prompt_ids), len(streamed), reasoning)
        return LimitEnd("stop" if stopped else "length", len(streamed), usage=usage, text=ending)
    message = f"no room for the request within DAYZERO_TASK_TIME_LIMIT_S={limit_s:g} s; retry later"
    return LimitEnd("error", 0, message, code=OVERLOADED)
