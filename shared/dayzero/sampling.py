"""Next-token selection under ``SamplingParams`` (dayzero.params): greedy, temperature, top-k, top-p, seed,
logit bias, presence and frequency penalties (OpenAI's definitions)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .params import Logprob, SamplingParams


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
