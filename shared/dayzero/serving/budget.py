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


def budget_pools(settings: Settings, cfg: ModelConfig) -> KVPools:
    """The pools of ``DAYZERO_KV_BUDGET_MB`` on the meta device, as a worker sizes them (``inspect``
    plans them too): windows for ``DAYZERO_MAX_BATCH`` sequences (one more, the padding rows, under
    DAYZERO_DECODE_GRAPHS), the rest of the budget to the growing pools. ValueError naming the
    variables when the budget cannot hold those windows."""
    layout = PoolLayout.of(cfg, settings.block_size, settings.dtype, mtp=settings.speculative_tokens > 0)
    sequences = settings.max_batch + settings.decode_graphs  # decode graphs' padding rows: a sequence of their own
    try:
        return KVPools.from_budget(layout, settings.kv_budget_mb << 20, sequences, torch_dtype(settings), device="meta")
    except ValueError:
        raise ValueError(
            f"DAYZERO_KV_BUDGET_MB={settings.kv_budget_mb} cannot hold the sliding windows of "
            f"DAYZERO_MAX_BATCH={settings.max_batch} sequences in blocks of DAYZERO_BLOCK_SIZE={settings.block_size} "
            "rows: raise the budget, or lower the batch or the block size"
        ) from None


def planned_pools(settings: Settings, cfg: ModelConfig, strict: bool = False) -> KVPools:
    """``budget_pools``, checked against the context limit: pools shorter than one sequence of it
    (its requests would fail after admission) are a ValueError when ``strict`` (``up``), else a
    warning (a worker started by hand)."""
    pools = budget_pools(settings, cfg)
    limit = context_limit(cfg, settings.max_context)
    if pools.capacity_tokens() < limit:
        short = (
            f"DAYZERO_KV_BUDGET_MB={settings.kv_budget_mb} holds {pools.capacity_tokens()} tokens of one sequence, "
            f"under the context limit of {limit} (DAYZERO_MAX_CONTEXT, at most the model's "
            f"{cfg.max_position_embeddings}): such a request would fail once admitted; raise DAYZERO_KV_BUDGET_MB "
            "or lower DAYZERO_MAX_CONTEXT"
        )
        if strict:
            raise ValueError(short)
        log.warning("%s", short)
    return pools
