"""The attention-state pools a worker's settings give it, sized before anything is loaded (``up``
refuses what its workers could not start with, in one line naming the variables)."""

from __future__ import annotations

import logging

import torch

from ..completion import context_limit
from ..config import ModelConfig
from ..kv.layout import PoolLayout
from ..kv.pools import KVPools
from ..settings import Settings

log = logging.getLogger("dayzero.worker")


def torch_dtype(settings: Settings) -> torch.dtype:
    """DAYZERO_DTYPE as torch's: the weights' compute and the pools' dtype."""
    return torch.bfloat16 if settings.dtype == "bfloat16" else torch.float32


def planned_pools(settings: Settings, cfg: ModelConfig, strict: bool = False) -> KVPools:
    """The pools of ``DAYZERO_KV_BUDGET_MB`` on the meta device; ValueError naming the variables when
    the budget cannot hold ``DAYZERO_MAX_BATCH`` sequences' windows. Pools shorter than one sequence
    of the context limit (its requests would fail after admission): ValueError too when ``strict``
    (``up``), else a warning (a worker started by hand)."""
    layout = PoolLayout.of(cfg, settings.block_size, settings.dtype, mtp=settings.speculative_tokens > 0)
    sequences = settings.max_batch + settings.decode_graphs  # decode graphs' padding rows: a sequence of their own
    budget, dtype = f"DAYZERO_KV_BUDGET_MB={settings.kv_budget_mb}", torch_dtype(settings)
    try:
        pools = KVPools.from_budget(layout, settings.kv_budget_mb << 20, sequences, dtype, device="meta")
    except ValueError:
        raise ValueError(
            f"{budget} cannot hold the sliding windows of DAYZERO_MAX_BATCH={settings.max_batch} sequences in "
            f"blocks of DAYZERO_BLOCK_SIZE={settings.block_size} rows: raise the budget, or lower the batch or "
            "the block size"
        ) from None
    limit = context_limit(cfg, settings.max_context)
    if pools.capacity_tokens() < limit:
        short = (
            f"{budget} holds {pools.capacity_tokens()} tokens of one sequence, under the context limit of "
            f"{limit} (DAYZERO_MAX_CONTEXT, at most the model's {cfg.max_position_embeddings}): such a request "
            "would fail once admitted; raise DAYZERO_KV_BUDGET_MB or lower DAYZERO_MAX_CONTEXT"
        )
        if strict:
            raise ValueError(short)
        log.warning("%s", short)
    return pools
