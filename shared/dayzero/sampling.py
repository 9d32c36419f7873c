"""Sampling parameters and next-token selection: greedy, temperature, top-k, top-p, seed,
logit bias, presence and frequency penalties (OpenAI's definitions)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .guided import Grammar

MAX_LOGPROBS = 20


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = no limit
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, bias added to its logit), as OpenAI's
    presence_penalty: float = 0.0  # subtracted once from the logit of every token already generated
    frequency_penalty: float = 0.0  # subtracted per earlier occurrence of the token in the completion
    logprobs: int | None = None  # report each token's log-probability and this many top alternatives
    grammar: Grammar | None = None  # constrained decoding: only tokens the grammar allows

    def __post_init__(self) -> None:
        if not (-2.0 <= self.presence_penalty <= 2.0 and -2.0 <= self.frequency_penalty <= 2.0):
            raise ValueError("presence_penalty and frequency_penalty must be in [-2, 2]")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}]")
        if any(not -100.0 <= b <= 100.0 for _, b in self.logit_bias):
            raise ValueError("logit_bias values must be in [-100, 100]")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError("temperature must be in [0, 100]")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must not be empty")


Logprob = tuple[float, tuple[tuple[int, float], ...]]  # a token's log-probability, the top (token, logprob)s


def logprobs_of(logits: torch.Tensor, tokens: list[int], top: int) -> list[Logprob]:
    """Each row's log-probability of its token and the row's ``top`` most likely tokens, from the
    raw logits [R, V] (before bias, penalties and temperature: what the model itself predicts)."""
    logp = logits.float().log_softmax(dim=-1)
    chosen = logp.gather(1, torch.tensor(tokens, device=logp.device)[:, None])[:, 0].tolist()
    if not top:
        return [(c, ()) for c in chosen]
    best = logp.topk(top, dim=-1)
    pairs = [tuple(zip(i, v, strict=True)) for i, v in zip(best.indices.tolist(), best.values.tolist(), strict=True)]
    return list(zip(chosen, pairs, strict=True))


@dataclass
class PromptLogprobs:
    """Each prompt token's log-probability given the tokens before it (the first token has
    none), with ``top`` alternatives; filled chunk by chunk by ``prefill``."""

    top: int
    scores: list[Logprob] = field(default_factory=list)


def _adjusted(logits: torch.Tensor, params: SamplingParams, counts: dict[int, int] | None) -> torch.Tensor:
    """logits [V] with the logit bias added and the presence / frequency penalties subtracted."""
    if params.logit_bias:
        logits = logits.clone()
        for token, bias in params.logit_bias:
            if 0 <= token < logits.shape[-1]:
                logits[token] += bias
    if counts and (params.presence_penalty or params.frequency_penalty):
        tokens = torch.tensor(list(counts), device=logits.device)
        seen = torch.tensor(list(counts.values()), dtype=logits.dtype, device=logits.device)
        logits = logits.clone()
        logits[tokens] -= seen * params.frequency_penalty + params.presence_penalty
    return logits


def distribution(logits: torch.Tensor, params: SamplingParams, counts: dict[int, int] | None = None) -> torch.Tensor:
    """The distribution ``sample`` draws from [V] fp32 (greedy: all mass on the argmax)."""
    logits = _adjusted(logits, params, counts)
    if params.temperature == 0.0:
        return torch.nn.functional.one_hot(logits.argmax(), logits.shape[-1]).float()
    logits = logits.float() / params.temperature
    if params.top_k:
        kth = torch.topk(logits, min(params.top_k, logits.shape[-1])).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        before = sorted_probs.cumsum(0) - sorted_probs  # mass strictly above each token
        sorted_probs = sorted_probs.masked_fill((before >= params.top_p) & (before > 0), 0.0)  # keep the best
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return probs


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from ``probs`` [V]; a seed draws the same token wherever the probabilities live."""
    if generator is not None:
        probs = probs.to(generator.device)
    return int(torch.multinomial(probs, 1, generator=generator))


def sample(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    counts: dict[int, int] | None = None,
) -> int:
    """logits [V] fp32 -> one token id; ``counts``: how often each token was generated so far."""
    if params.temperature == 0.0:
        return int(_adjusted(logits, params, counts).argmax())
    return draw(distribution(logits, params, counts), generator)


def verify_draft(
    p: torch.Tensor, q: torch.Tensor, token: int, greedy: bool, generator: torch.Generator | None
) -> tuple[bool, int]:
    """Speculative sampling: a draft ``token`` drawn from ``q`` [V] is kept with probability
    min(1, p(x) / q(x)), else a token is drawn from norm(max(0, p - q)); either way the token
    follows ``p`` [V] exactly. Greedy (one-hot p and q): kept iff it is p's argmax.
    -> (kept, the token: the draft or its replacement)."""
    if greedy:
        best = int(p.argmax())
        return best == token, best
    u = torch.rand((), generator=generator, device=generator.device if generator is not None else "cpu")
    if u.item() < min(1.0, (p[token] / q[token]).item()):
        return True, token
    residual = (p - q).clamp_min(0)
    return False, draw(residual / residual.sum() if residual.sum() > 0 else p, generator)
