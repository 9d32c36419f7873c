"""One packed prefill step as pure units: which prompts run (identical ones once), what each
request's input embeddings are (images spliced in), whose prompt logprobs are scored, and the
forward itself. The prefill loop batches, admits and hands off; the maths is here, and every
rank of a tensor-parallel group runs it alike (dayzero.serving.ranks): images go in as the
vision stage's patches, embedded inside the step (the embedding is split over the ranks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..kv.handoff import export_state, import_state
from ..kv.pools import KVPools
from ..model.forward import prefill
from ..model.plan import AttentionOptions
from ..model.vocab import embed_tokens
from ..model.weights import Transformer
from ..sampling import PromptLogprobs
from ..vision.encoder import splice
from .messages import PrefillJob


@dataclass(frozen=True, slots=True)
class BatchInput:
    """One admitted request of the step: its sequence id, its tokens (prompt + tokens already
    streamed; the first ``prompt_length`` are the prompt), its images' merged patches
    [patches, hidden] when it has images, and its prompt logprobs when asked for."""

    seq_id: str
    tokens: list[int]
    images: torch.Tensor | None = None
    echo: PromptLogprobs | None = None
    prompt_length: int | None = None  # None: all of ``tokens``

    @property
    def prompt(self) -> list[int]:
        return self.tokens if self.prompt_length is None else self.tokens[: self.prompt_length]


def shared_forward(tokens: Sequence[int], images: bool, echo: PromptLogprobs | None) -> tuple | None:
    """What rows sharing one forward have alike: identical text prompts asking for the same prompt
    logprobs (the choices of an ``n`` > 1 request) run once; image prompts (None) always run alone."""
    return None if images else (tuple(tokens), echo.top if echo else None)


def forward_of(job: PrefillJob) -> tuple | None:
    """``shared_forward`` of a job's input, before it is taken (its tokens: prompt + tokens streamed)."""
    return shared_forward((*job.request.prompt_ids, *job.generated), job.embeddings is not None, echo_of(job))


def merged(inputs: list[BatchInput]) -> dict[int, int]:
    """Row -> the row whose forward it shares (``shared_forward``)."""
    first: dict[tuple, int] = {}
    source = {}
    for i, item in enumerate(inputs):
        key = shared_forward(item.tokens, item.images is not None, item.echo)
        source[i] = i if key is None else first.setdefault(key, i)
    return source


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


def prefill_batch(
    model: Transformer,
    pools: KVPools,
    inputs: list[BatchInput],
    source: dict[int, int],
    options: AttentionOptions,
    chunk_size: int,
) -> list[torch.Tensor]:
    """Each input's next-token logits [V] (its state in ``pools`` under its seq id, its prompt
    logprobs in its ``echo``); ``source``: ``merged(inputs)``, a merged input gets a copy of its
    source's state and scores."""
    run = [i for i, s in source.items() if s == i]
    with_images = any(inputs[i].images is not None for i in run)
    logits = prefill(
        model,
        pools,
        [inputs[i].seq_id for i in run],
        [inputs[i].tokens for i in run],
        options,
        chunk_size,
        [input_embeddings(model, inputs[i]) if inputs[i].images is not None else None for i in run]
        if with_images
        else None,
        {j: inputs[i].echo for j, i in enumerate(run) if inputs[i].echo is not None},
    )
    out = dict(zip(run, logits, strict=True))
    for i, s in source.items():
        if s != i:
            import_state(pools, pools, export_state(pools, inputs[s].seq_id), inputs[i].seq_id)
            out[i] = out[s]
            if inputs[i].echo is not None:
                inputs[i].echo.scores = inputs[s].echo.scores
    return [out[i] for i in range(len(inputs))]
