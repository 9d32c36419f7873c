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
        end = begin + chunk_size
        hidden = prefill_step(
            model,
            pools,
            [seq_ids[s] for s in active],
            [prompts[s][begin:end] for s in active],
            [prompts[s][end] if len(prompts[s]) > end else None for s in active],
            options,
            [None if embeds is None or embeds[s] is None else embeds[s][begin:end] for s in active],
            {j: prompt_logprobs[s] for j, s in enumerate(active) if prompt_logprobs and s in prompt_logprobs},
        )
        for j, s in enumerate(active):
            if len(prompts[s]) <= end:
                last[s] = hidden[j]
    return lm_logits(model, last).float()


@torch.inference_mode()
def prefill_step(
    model: Transformer,
    pools: KVPools,
    seq_ids: list[str],
    chunks: list[list[int]],
    afters: list[int | None],
    options: AttentionOptions = AttentionOptions(),
    embeds: list[torch.Tensor | None] | None = None,
    prompt_logprobs: dict[int, PromptLogprobs] | None = None,
) -> torch.Tensor:
    """One packed step of prefill: each sequence's next ``chunks[s]`` tokens after its committed
    length; -> the normed hidden of each chunk's last row [B, D].

    ``afters[s]``: the prompt token after the chunk (None: the chunk ends the prompt), which the MTP
    layer and the prompt logprobs read at the chunk's last row. ``embeds[s]`` optionally replaces
    chunk ``s``'s token embeddings ([len, hidden]); ``prompt_logprobs[s]`` receives the
    log-probability of each token after one of chunk ``s``'s rows (appended: a prompt's chunks in order).
    """
    plan = reserve_plan(model, pools, seq_ids, chunks, options)
    chunk_embeds = None
    if embeds is not None and any(e is not None for e in embeds):
        rows = zip(embeds, plan.batch.row0s, plan.batch.news, strict=True)
        chunk_embeds = torch.cat(
            [e if e is not None else embed_tokens(model, plan.token_ids[r : r + n]) for e, r, n in rows]
        )
    streams = run_layers(model, plan, pools, chunk_embeds)
    _commit(pools, seq_ids, plan)
    following = [c[1:] if after is None else [*c[1:], after] for c, after in zip(chunks, afters, strict=True)]
    if pools.layout.mtp_layers:  # fill the MTP layer's window: each row with the prompt token after it
        follow(model, pools, seq_ids, plan, streams, following)
    hidden = head(model, streams)
    for s, row in enumerate(plan.batch.row0s):
        if prompt_logprobs and s in prompt_logprobs:
            _score(model, hidden[row : row + len(following[s])], following[s], prompt_logprobs[s])
    return hidden[plan.last_rows()]


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
