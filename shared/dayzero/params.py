"""The sampling contract: one frozen dataclass from the API edge to the sampler.

The gateway validates a request body against these bounds (400 naming the parameter) and builds
``SamplingParams`` once; it travels on the broker by field name (pydantic serializes the dataclass
inside ``GenerationRequest``) and is rebuilt, re-checked, in every stage. Plain data, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

# Floors and bounds that sampling needs: a temperature of 1e-310 divides logits into infinities, and
# token i of a seeded request draws from seed * 1_000_003 + i, which must fit torch's 64-bit seed.
MAX_TEMPERATURE = 100.0
MIN_TEMPERATURE = 1e-3
MAX_SEED = 2**44
MAX_PENALTY = 2.0
MAX_BIAS = 100.0
MAX_LOGPROBS = 20

SEED_RANGE = (-(2**63), 2**63 - 1)  # a seed as sent: OpenAI's int64, the API's and the command line's


def sampler_seed(seed: int) -> int:
    """A seed as sent (in SEED_RANGE) as one the sampler takes, in [0, MAX_SEED]: the API and
    ``dayzero generate`` draw alike for one seed."""
    return seed % (MAX_SEED + 1)


Logprob = tuple[float, tuple[tuple[int, float], ...]]  # a token's log-probability, the top (token, logprob)s


@dataclass(frozen=True, slots=True)
class Grammar:
    """A constrained request's grammar (Lark, llguidance's dialect), rebuilt by every stage that samples."""

    lark: str
    after: int | None = None  # the grammar starts after this token (``</think>``: reasoning is free)
    # the request's field it enforces (response_format, tools): its 400's param. The admitting gateway's
    # own, never on the wire: the previous version's workers and gateways refuse a grammar with a field
    # they do not know (a stream resumed on another gateway names none)
    param: Annotated[str | None, Field(exclude=True)] = None


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy, else at least MIN_TEMPERATURE
    top_p: float = 1.0  # in [0, 1] as OpenAI's; 0 keeps the most likely token alone (vLLM's least: 1e-3)
    top_k: int = 0  # 0 = no limit
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_bounds: tuple[str, ...] = ()  # texts that end the stop strings' search (a tool-call block's opening)
    ignore_eos: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, bias added to its logit), as OpenAI's
    presence_penalty: float = 0.0  # subtracted once from the logit of every token already generated
    frequency_penalty: float = 0.0  # subtracted per earlier occurrence of the token in the completion
    logprobs: int | None = None  # report each token's log-probability and this many top alternatives
    grammar: Grammar | None = None  # constrained decoding: only tokens the grammar allows

    @property
    def greedy(self) -> bool:
        """The argmax of the logits alone: temperature 0, or top_p 0 (its nucleus: the best token; a
        softmax at a temperature may round the best two logits to one probability)."""
        return self.temperature == 0.0 or self.top_p == 0.0

    def __post_init__(self) -> None:
        problem = next((message for broken, message in _checks(self) if broken), None)
        if problem:
            raise ValueError(problem)


def _checks(p: SamplingParams) -> list[tuple[bool, str]]:
    return [
        (p.max_tokens < 1, "max_tokens must be >= 1"),
        (
            not (p.temperature == 0.0 or MIN_TEMPERATURE <= p.temperature <= MAX_TEMPERATURE),
            f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}]",
        ),
        (not 0.0 <= p.top_p <= 1.0, "top_p must be in [0, 1]"),
        (p.top_k < 0, "top_k must be >= 0"),
        (p.seed is not None and not 0 <= p.seed <= MAX_SEED, f"seed must be in [0, {MAX_SEED}]"),
        (any(not s for s in p.stop), "stop strings must not be empty"),
        (any(not s for s in p.stop_bounds), "stop bounds must not be empty"),
        (not all(map(is_unicode, p.stop)), "stop strings must be Unicode text (a lone surrogate never matches)"),
        (any(not -MAX_BIAS <= b <= MAX_BIAS for _, b in p.logit_bias), f"logit_bias values must be in ±{MAX_BIAS}"),
        (
            not (abs(p.presence_penalty) <= MAX_PENALTY and abs(p.frequency_penalty) <= MAX_PENALTY),
            f"presence_penalty and frequency_penalty must be in [-{MAX_PENALTY}, {MAX_PENALTY}]",
        ),
        (p.logprobs is not None and not 0 <= p.logprobs <= MAX_LOGPROBS, f"logprobs must be in [0, {MAX_LOGPROBS}]"),
    ]


def is_unicode(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate (JSON's "\ud800", argv's undecodable bytes)
        return False
    return True
