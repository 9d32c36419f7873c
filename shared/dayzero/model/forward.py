"""The forward passes: ``prefill`` (prompts, chunked) and ``decode`` (one token per sequence).

Both run packed tokens of several sequences through the same layers; each sequence's
attention state lives in the block pools under the caller's sequence id and grows in place.
"""

from __future__ import annotations

import torch

from ..kv.pools import KVPools
from ..sampling import PromptLogprobs, logprobs_of
from .block import block_forward, stack_head
from .mtp import follow, mtp_forward
from .plan import AttentionOptions, Bucket, StepPlan, plan_step
from .vocab import embed_tokens, lm_logits
from .weights import Transformer


def run_layers(
    model: Transformer,
    plan: StepPlan,
    pools: KVPools,
    embeds: torch.Tensor | None = None,
    capture: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """Packed tokens -> the final hyper-connection streams [T, N, D] (before the hc head).

    Writes the step's rows into every layer's pools; the caller commits what it keeps.
    ``capture`` receives each layer's streams [T, N, D]."""
    cfg = model.cfg
    x = embed_tokens(model, plan.token_ids) if embeds is None else embeds
    streams = x.unsqueeze(1).expand(-1, cfg.hc_mult, -1).contiguous()  # [T, N, D]
    for i, block in enumerate(model.layers):
        streams = block_forward(block, cfg, i, streams, plan, pools, model.comm)
        if capture is not None:
            capture.append(streams)
    return streams


def head(model: Transformer, streams: torch.Tensor) -> torch.Tensor:
    """Final streams [T, N, D] -> normed hidden [T, D] (the shared head's input)."""
    return stack_head(model.cfg, streams, model.hc_head_fn, model.hc_head_base, model.hc_head_scale, model.norm.weight)


def reserve_plan(
    model: Transformer,
    pools: KVPools,
    seq_ids: list[str],
    chunks: list[list[int]],
    options: AttentionOptions,
    bucket: Bucket | None = None,
) -> StepPlan:
    """Reserve blocks for ``chunks`` after each sequence's committed length, and plan the step
    (``bucket``: padded to its shape, ``plan_step``)."""
    starts = [pools.length(s) if s in pools.sequences else 0 for s in seq_ids]
    for seq_id, start, chunk in zip(seq_ids, starts, chunks, strict=True):
        pools.reserve(seq_id, start + len(chunk))
    return plan_step(model.cfg, pools, seq_ids, starts, chunks, options, bucket)


def _commit(pools: KVPools, seq_ids: list[str], plan: StepPlan) -> None:
    for seq_id, n in zip(seq_ids, plan.batch.news, strict=True):
        pools.commit(seq_id, n)


@torch.inference_mode()
def prefill(
    model: Transformer,
    pools: KVPools,
    seq_ids: list[str],
    prompts: list[list[int]],
    options: AttentionOptions = AttentionOptions(),
    chunk_size: int = 2048,
    embeds: list[torch.Tensor | None] | None = None,
    prompt_logprobs: dict[int, PromptLogprobs] | None = None,
) -> torch.Tensor:
    """Feed each prompt (continuing its sequence) in chunks; -> logits of each last token [B, V].

    ``embeds[s]`` optionally replaces prompt ``s``'s token embeddings ([len, hidden]);
    ``prompt_logprobs[s]`` receives the log-probability of each of prompt ``s``'s tokens after
    the first (the echo of a completion request).
    """
    if any(not p for p in prompts):
        raise ValueError("prompts must not be empty")
    device = model.head.weight.device
    last = torch.empty(len(prompts), model.cfg.hidden_size, dtype=model.head.weight.dtype, device=device)
    if pools.layout.mtp_layers:
        _catch_up_mtp(model, pools, seq_ids, prompts, options)
    for begin in range(0, max(len(p) for p in prompts), chunk_size):
        active = [s for s, p in enumerate(prompts) if len(p) > begin]
        chunks = [prompts[s][begin : begin + chunk_size] for s in active]
        ids = [seq_ids[s] for s in active]
        plan = reserve_plan(model, pools, ids, chunks, options)
        chunk_embeds = None
        if embeds is not None and any(embeds[s] is not None for s in active):
            rows = zip(active, plan.batch.row0s, plan.batch.news, strict=True)
            chunk_embeds = torch.cat(
                [
                    embed_tokens(model, plan.token_ids[r : r + n])
                    if embeds[s] is None
                    else embeds[s][begin : begin + n]
                    for s, r, n in rows
                ]
            )
        streams = run_layers(model, plan, pools, chunk_embeds)
        _commit(pools, ids, plan)
        if pools.layout.mtp_layers:  # fill the MTP layer's window: each row with the prompt token after it
            follow(model, pools, ids, plan, streams, [prompts[s][begin + 1 : begin + chunk_size + 1] for s in active])
        hidden = head(model, streams)
        for s, row, n in zip(active, plan.batch.row0s, plan.batch.news, strict=True):
            if prompt_logprobs and s in prompt_logprobs:
                following = prompts[s][begin + 1 : begin + n + 1]  # the prompt token after each row
                _score(model, hidden[row : row + len(following)], following, prompt_logprobs[s])
        for s, row in zip(active, plan.last_rows(), strict=True):
            if len(prompts[s]) <= begin + chunk_size:
                last[s] = hidden[row]
    return lm_logits(model, last).float()


def _catch_up_mtp(
    model: Transformer, pools: KVPools, seq_ids: list[str], prompts: list[list[int]], options: AttentionOptions
) -> None:
    """A continued sequence's MTP layer has yet to consume its last position's streams (``KVPools.hidden``,
    kept with no token after them): feed them with the first new token, as a speculative step's first
    draft does, so its window row there is written before the new rows."""
    continued = [i for i, s in enumerate(seq_ids) if s in pools.sequences and pools.length(s) > 0]
    if continued:
        ids, firsts = [seq_ids[i] for i in continued], [[prompts[i][0]] for i in continued]
        plan = plan_step(model.cfg, pools, ids, [pools.length(s) - 1 for s in ids], firsts, options)
        mtp_forward(model, plan, pools, pools.hidden(ids, model.head.weight.dtype))


def _score(model: Transformer, rows: torch.Tensor, following: list[int], out: PromptLogprobs, slab: int = 512) -> None:
    """Log-probabilities of ``following`` under each row's logits, a slab of rows at a time."""
    for begin in range(0, len(following), slab):
        logits = lm_logits(model, rows[begin : begin + slab])
        out.scores += logprobs_of(logits, following[begin : begin + slab], out.top)


@torch.inference_mode()
def decode(
    model: Transformer,
    pools: KVPools,
    seq_ids: list[str],
    tokens: list[int],
    options: AttentionOptions = AttentionOptions(),
) -> torch.Tensor:
    """One new token per sequence -> next-token logits [B, V] (the pools hold no MTP state: a
    speculating decode goes through ``dayzero.speculative``)."""
    plan = reserve_plan(model, pools, seq_ids, [[t] for t in tokens], options)
    hidden = head(model, run_layers(model, plan, pools))
    _commit(pools, seq_ids, plan)
    return lm_logits(model, hidden).float()


@torch.inference_mode()
def score(
    model: Transformer,
    pools: KVPools,
    seq_id: str,
    ids: list[int],
    options: AttentionOptions = AttentionOptions(),
    capture: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """Logits at every position of ``ids`` in one pass [L, V].

    ``capture`` receives each layer's residual streams [L, N, D], then the final hidden [L, D].
    """
    plan = reserve_plan(model, pools, [seq_id], [ids], options)
    hidden = head(model, run_layers(model, plan, pools, capture=capture))
    _commit(pools, [seq_id], plan)
    if capture is not None:
        capture.append(hidden)
    return lm_logits(model, hidden).float()
