"""The forward passes: ``prefill`` (prompts, chunked) and ``decode`` (one token per sequence).

Both run packed tokens of several sequences through the same layers; each sequence's
attention state lives in the block pools under the caller's sequence id and grows in place.
"""

from __future__ import annotations

import torch

from ..kv.pools import KVPools
from ..sampling import PromptLogprobs, logprobs_of
from .attention import attention
from .hyper import collapse, head_collapse
from .moe import moe
from .norms import rms_norm
from .plan import AttentionOptions, StepPlan, plan_step
from .vocab import embed_tokens, lm_logits
from .weights import Transformer


def _layers(
    model: Transformer,
    plan: StepPlan,
    pools: KVPools,
    seq_ids: list[str],
    embeds: torch.Tensor | None,
    capture: list[torch.Tensor] | None,
) -> torch.Tensor:
    """Packed tokens -> final normed hidden states [T, hidden]."""
    cfg = model.cfg
    eps, iters, hc_eps, backend = cfg.rms_norm_eps, cfg.hc_sinkhorn_iters, cfg.hc_eps, plan.options.backend
    x = embed_tokens(model, plan.token_ids) if embeds is None else embeds
    streams = x.unsqueeze(1).expand(-1, cfg.hc_mult, -1).contiguous()  # [T, N, D]
    for i, block in enumerate(model.layers):
        h, mix = collapse(
            streams, block.hc_attn_fn, block.hc_attn_base, block.hc_attn_scale, iters, hc_eps, eps, backend
        )
        attn_in = rms_norm(h, block.attn_norm.weight, eps)
        streams = mix.merge(streams, attention(block.attn, cfg, i, attn_in, plan, pools, model.comm))
        h, mix = collapse(streams, block.hc_ffn_fn, block.hc_ffn_base, block.hc_ffn_scale, iters, hc_eps, eps, backend)
        ffn_in = rms_norm(h, block.ffn_norm.weight, eps)
        streams = mix.merge(streams, moe(block.ffn, cfg, ffn_in, plan.token_ids, backend, model.comm))
        if capture is not None:
            capture.append(streams)
    for seq_id, n in zip(seq_ids, plan.batch.news, strict=True):
        pools.sequences[seq_id].length += n
    collapsed = head_collapse(streams, model.hc_head_fn, model.hc_head_base, model.hc_head_scale, hc_eps, eps)
    hidden = rms_norm(collapsed, model.norm.weight, eps)
    if capture is not None:
        capture.append(hidden)
    return hidden


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
    for begin in range(0, max(len(p) for p in prompts), chunk_size):
        active = [s for s, p in enumerate(prompts) if len(p) > begin]
        chunks = [prompts[s][begin : begin + chunk_size] for s in active]
        ids = [seq_ids[s] for s in active]
        plan = plan_step(model.cfg, pools, ids, chunks, options)
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
        hidden = _layers(model, plan, pools, ids, chunk_embeds, None)
        for s, row, n in zip(active, plan.batch.row0s, plan.batch.news, strict=True):
            if prompt_logprobs and s in prompt_logprobs:
                following = prompts[s][begin + 1 : begin + n + 1]  # the prompt token after each row
                _score(model, hidden[row : row + len(following)], following, prompt_logprobs[s])
        for s, row in zip(active, plan.last_rows(), strict=True):
            if len(prompts[s]) <= begin + chunk_size:
                last[s] = hidden[row]
    return lm_logits(model, last).float()


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
    """One new token per sequence -> next-token logits [B, V]."""
    plan = plan_step(model.cfg, pools, seq_ids, [[t] for t in tokens], options)
    return lm_logits(model, _layers(model, plan, pools, seq_ids, None, None)).float()


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
    plan = plan_step(model.cfg, pools, [seq_id], [ids], options)
    return lm_logits(model, _layers(model, plan, pools, [seq_id], None, capture)).float()
