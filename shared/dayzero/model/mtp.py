"""DeepSeek's multi-token-prediction layer (``mtp.0``): from the main model's hyper-connection
streams at position t and the token at t+1, the logits of the token at t+2.

Input streams = ``e_proj(enorm(embed(next)))`` (broadcast over the streams) ``+ h_proj(hnorm(h))``;
then one decoder block numbered ``num_layers`` (sliding attention with its own window ring in the
pools, score-routed MoE), its own hc head and norm, and the shared output head. Its window lags
the main model by one position: position t is fed once token t+1 is known.
"""

from __future__ import annotations

import torch

from ..kernels.norms import rms_norm
from ..kv.pools import KVPools
from .block import block_forward, stack_head
from .plan import StepPlan, plan_step
from .vocab import embed_tokens
from .weights import Transformer


def mtp_forward(
    model: Transformer, plan: StepPlan, pools: KVPools, h: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``h`` [T, N, D]: streams at the plan's positions (the main model's, or the MTP layer's own for
    a further draft); ``plan.token_ids`` [T]: the token after each position.

    -> (the MTP block's streams [T, N, D], normed hidden [T, D] whose logits predict one token further).
    Writes the MTP layer's window rows at the plan's positions."""
    cfg, mtp = model.cfg, model.mtp[0]
    eps, backend = cfg.rms_norm_eps, plan.options.backend
    e = mtp.e_proj(rms_norm(embed_tokens(model, plan.token_ids), mtp.enorm.weight, eps, backend))  # [T, D]
    x = e.unsqueeze(1) + mtp.h_proj(rms_norm(h, mtp.hnorm.weight, eps, backend))  # [T, N, D]
    streams = block_forward(mtp, cfg, cfg.num_layers, x, plan, pools, model.comm)
    return streams, stack_head(cfg, streams, mtp.hc_head_fn, mtp.hc_head_base, mtp.hc_head_scale, mtp.norm.weight)


def follow(
    model: Transformer,
    pools: KVPools,
    seq_ids: list[str],
    plan: StepPlan,
    streams: torch.Tensor,
    nexts: list[list[int]],
) -> None:
    """After a main-model step (``plan``, its final ``streams`` [T, N, D]): feed the MTP layer each
    sequence's first ``len(nexts[s])`` rows with the tokens that follow them (a prompt shifted by
    one, or the accepted drafts), and keep the row after those as the sequence's pending MTP input
    when the step has one (the last row of a prompt, the last accepted position of a verify)."""
    batch = plan.batch
    fed = [s for s, nx in enumerate(nexts) if nx]
    if fed:
        sub = plan_step(
            model.cfg,
            pools,
            [seq_ids[s] for s in fed],
            [batch.starts[s] for s in fed],
            [nexts[s] for s in fed],
            plan.options,
        )
        rows = torch.cat([streams[batch.row0s[s] : batch.row0s[s] + len(nexts[s])] for s in fed])
        mtp_forward(model, sub, pools, rows)
    kept = [s for s, nx in enumerate(nexts) if len(nx) < batch.news[s]]
    if kept:
        pools.keep_hidden([seq_ids[s] for s in kept], streams[[batch.row0s[s] + len(nexts[s]) for s in kept]])
