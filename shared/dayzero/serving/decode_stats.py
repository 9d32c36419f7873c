"""A decode step's metrics: batch size, tokens/s, and the CSA entries the indexer lets each query
read (docs/metrics.md)."""

from __future__ import annotations

from .runtime import Runtime


def record_step(runtime: Runtime, ids: list[str], emitted: int, seconds: float) -> None:
    """One step of ``ids`` that emitted ``emitted`` tokens in ``seconds``."""
    cfg, stats = runtime.model.cfg, runtime.stats
    stats.call("decode")
    stats.add(steps=1, tokens=emitted)
    rate = cfg.compress_rates["compressed_sparse_attention"]
    entries = [runtime.pools.length(rid) // rate for rid in ids]
    available = sum(entries)
    fraction = sum(min(cfg.index_topk, n) for n in entries) / available if available else 1.0
    stats.set(batch_size=len(ids), tokens_per_s=emitted / seconds if seconds else 0.0, selected_fraction=fraction)
