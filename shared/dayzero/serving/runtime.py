"""What a worker process holds: the model, the tokenizer, its attention pools, the store."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch

from ..checkpoint import load_model
from ..kv.layout import PoolLayout
from ..kv.pools import KVPools
from ..kv.shared import Segment, SharedPools
from ..model.weights import Transformer
from ..settings import Settings
from ..tokenizer import TextCodec
from .store import Store

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
log = logging.getLogger("dayzero.worker")


def checkpoint_path(settings: Settings) -> Path:
    """The configured checkpoint, or the built-in demo checkpoint (created once)."""
    if settings.checkpoint is not None:
        return settings.checkpoint
    from ..demo import ensure_demo_checkpoint

    return ensure_demo_checkpoint(settings.demo_checkpoint)


@dataclass
class Runtime:
    settings: Settings
    model: Transformer
    codec: TextCodec
    pools: KVPools
    store: Store
    name: str
    segment: Segment | None = None

    @classmethod
    def load(cls, settings: Settings, name: str, shared: bool) -> Runtime:
        """``name`` identifies the worker in leases and heartbeats (unique per process)."""
        path = checkpoint_path(settings)
        dtype = DTYPES[settings.dtype]
        model = load_model(path, dtype, progress=False, expert_cache_bytes=settings.expert_cache_mb << 20)
        layout = PoolLayout.of(model.cfg, settings.block_size, settings.dtype)
        budget = settings.kv_budget_mb << 20
        sized = KVPools.from_budget(layout, budget, settings.max_batch, dtype, device="meta")
        if shared:
            pools, segment = SharedPools.create(layout, sized.blocks, dtype)
        else:
            pools, segment = KVPools(layout, sized.blocks, dtype), None
        name = f"{name}:{uuid.uuid4().hex[:6]}"
        log.info("%s loaded %s: pools %s", name, path, pools.usage())
        return cls(
            settings,
            model,
            TextCodec.from_checkpoint(path),
            pools,
            Store.connect(settings.redis_url, settings.stream_ttl_s),
            name,
            segment,
        )

    def close(self) -> None:
        if self.segment is not None:
            self.segment.close()
            self.segment.unlink()
