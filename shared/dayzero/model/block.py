"""One decoder block over hyper-connection streams, and the head collapse that ends a stack."""

from __future__ import annotations

import torch

from ..config import ModelConfig
from ..kernels.norms import rms_norm
from ..kv.pools import KVPools
from ..parallel import Group
from .attention import attention
from .hyper import collapse, head_collapse
from .moe import moe
from .plan import StepPlan
from .weights import Block


def block_forward(
    block: Block, cfg: ModelConfig, layer: int, streams: torch.Tensor, plan: StepPlan, pools: KVPools, comm: Group
) -> torch.Tensor:
    """streams [T, N, D] -> [T, N, D] through layer ``layer`` (attention writes its pools)."""
    eps, iters, hc_eps, backend = cfg.rms_norm_eps, cfg.hc_sinkhorn_iters, cfg.hc_eps, plan.options.backend
    h, mix = collapse(streams, block.hc_attn_fn, block.hc_attn_base, block.hc_attn_scale, iters, hc_eps, eps, backend)
    attn_in = rms_norm(h, block.attn_norm.weight, eps, backend)
    streams = mix.merge(streams, attention(block.attn, cfg, layer, attn_in, plan, pools, comm))
    h, mix = collapse(streams, block.hc_ffn_fn, block.hc_ffn_base, block.hc_ffn_scale, iters, hc_eps, eps, backend)
    ffn_in = rms_norm(h, block.ffn_norm.weight, eps, backend)
    return mix.merge(streams, moe(block.ffn, cfg, ffn_in, plan.token_ids, backend, comm))


def stack_head(
    cfg: ModelConfig,
    streams: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    norm: torch.Tensor,
) -> torch.Tensor:
    """Final streams [T, N, D] -> normed hidden [T, D] for the shared output head."""
    collapsed = head_collapse(streams, fn, base, scale, cfg.hc_eps, cfg.rms_norm_eps)
    return rms_norm(collapsed, norm, cfg.rms_norm_eps)
