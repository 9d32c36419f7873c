"""One packed prefill step as pure units: which prompts run (identical ones once), a request's
input cut in chunks (images spliced in at their placeholders), whose prompt logprobs are scored,
and the step itself. The prefill loop schedules the chunks, admits and hands off; the maths is
here, and every rank of a tensor-parallel group runs it alike (dayzero.serving.ranks): images go
in as the vision stage's patches, embedded inside the step (the embedding is split over the ranks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kv.pools import KVPools
from ..model.forward import prefill_step
from ..model.plan import AttentionOptions
from ..model.vocab import embed_tokens, lm_logits
from ..model.weights import Transformer
from ..sampling import PromptLogprobs
from ..vision.encoder import splice
from .messages import PrefillJob


@dataclass(frozen=True, slots=True)
class BatchInput:
    """One request's input, or a chunk of it: its sequence id, its tokens (``prefilled_ids``; the
    first ``prompt_length`` are the prompt), its images' merged patches [patches,
    hidden] at the prompt's placeholders when it has images, its prompt logprobs when asked for,
    and, for a chunk that does not end its input, the token after it."""

    seq_id: str
    tokens: list[int]
    images: torch.Tensor | None = None
    echo: PromptLogprobs | None = None
    prompt_length: int | None = None  # None: all of ``tokens``
    after: int | None = None

    @property
    def prompt(self) -> list[int]:
        return self.tokens if self.prompt_length is None else self.tokens[: self.prompt_length]

    def chunks(self, size: int, image_token: int | None) -> list[BatchInput]:
        """The input cut in ``size``-token chunks, each prefilled after the one before it."""
        return [self.cut(begin, begin + size, image_token) for begin in range(0, len(self.tokens), size)]

    def cut(self, begin: int, end: int, image_token: int | None) -> BatchInput:
        """Tokens ``begin:end`` of the input, prefilled after those before them: with the patches of
        its own placeholders (``image_token``), the echo it adds to, the token after it."""
        rows = max(0, min(end, len(self.prompt)) - begin)  # its prompt tokens
        images = None
        if self.images is not None:
            patch, placeholders = self.prompt[:begin].count(image_token), self.prompt[begin:end].count(image_token)
            images = self.images[patch : patch + placeholders] if placeholders else None
        after = self.tokens[end] if end < len(self.tokens) else None
        return BatchInput(self.seq_id, self.tokens[begin:end], images, self.echo, rows, after)


def prefilled_ids(job: PrefillJob) -> tuple[int, ...]:
    """The tokens a request's prefill runs: its prompt, then the tokens a re-run streamed already
    but the last, which decode feeds as its pending token, as the lost run's next round would have
    (so a seeded run's draws resume where they were: a speculative round's start included)."""
    return (*job.request.prompt_ids, *job.generated[:-1])


def forward_of(job: PrefillJob) -> tuple | None:
    """What requests sharing one forward have alike: identical text inputs (``prefilled_ids``)
    asking for the same prompt logprobs (the choices of an ``n`` > 1 request) run once; image
    prompts (None) always run alone."""
    if job.embeddings is not None:
        return None
    echo = echo_of(job)
    return prefilled_ids(job), echo.top if echo else None


def echo_of(job: PrefillJob) -> PromptLogprobs | None:
    """The prompt's logprobs to score, once: a re-run's first token (and the echo) went out already."""
    if job.request.prompt_logprobs is None or job.generated:
        return None
    return PromptLogprobs(job.request.prompt_logprobs)


@torch.inference_mode()
def input_embeddings(model: Transformer, item: BatchInput) -> torch.Tensor:
    """The input's embeddings [L, hidden]: the prompt's with the images' merged patches at its
    placeholder positions, then the tokens already streamed."""
    prompt, device = item.prompt, model.embed.weight.device
    tokens = embed_tokens(model, torch.tensor(item.tokens, dtype=torch.long, device=device))
    rows = splice(tokens[: len(prompt)], prompt, model.cfg.raw["image_token_id"], [item.images.to(device)])
    return torch.cat((rows, tokens[len(prompt) :]))


@torch.inference_mode()
def prefill_chunks(
    model: Transformer, pools: KVPools, chunks: list[BatchInput], options: AttentionOptions
) -> list[torch.Tensor | None]:
    """One packed step, each chunk continuing its sequence in ``pools`` (its prompt logprobs added
    to its ``echo``): the next-token logits [V] of each chunk that ends its input, None for the others."""
    with_images = any(c.images is not None for c in chunks)
    hidden = prefill_step(
        model,
        pools,
        [c.seq_id for c in chunks],
        [c.tokens for c in chunks],
        [c.after for c in chunks],
        options,
        [input_embeddings(model, c) if c.images is not None else None for c in chunks] if with_images else None,
        {i: c.echo for i, c in enumerate(chunks) if c.echo is not None},
    )
    ends = [i for i, c in enumerate(chunks) if c.after is None]
    logits = dict(zip(ends, lm_logits(model, hidden[ends]).float() if ends else [], strict=True))
    return [logits.get(i) for i in range(len(chunks))]
