"""Lightning indexer: score compressed entries per query and keep the top-k.

  q        [T, Hi, Di] roped indexer queries
  weights  [T, Hi]     per-head weights (already scaled by Hi^-0.5)
  keys     [blocks, bs, Di] index-key pool; table [B, cb] int32
  visible  [T] int32   entries below it are causal for the query
score(t, e) = sum_h weights[t, h] * relu(q[t, h] . keys[e]) * Di^-0.5, -inf when e >= visible.
Queries are scored in blocks of rows against every entry visible to the block (matmuls on the
pool's contiguous block view where the sequence's blocks are consecutive, a cache-sized piece of
rows at a time: the [rows, Hi, entries] intermediate stays near 2 MiB; on a CPU with Di <= 16, one
compiled loop that keeps the products in registers); each block's [rows, entries] scores get one
top-k (a CPU's for k <= 64: one compiled pass a row), into one preallocated output. Ties go to the
lower entry index, and the selection is ordered by (score descending, entry ascending). Output
[T, topk] int32, -1 where fewer entries are visible.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .batch import Backend, RaggedBatch
from .indexer_torch import torch_blocks
from .indexer_triton import triton_blocks
from .topk import SCAN_TOPK_MAX, earliest_topk, scanned_topk


def indexer_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    batch: RaggedBatch,
    keys: torch.Tensor,
    table: torch.Tensor,
    visible: torch.Tensor,
    topk: int,
    backend: Backend = "torch",
    rows_max: int | None = None,
    visible_max: int | None = None,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """[T, topk] int32 selected entry ids (-1 = none); see the module docstring. ``rows_max``:
    rows per scored block (default: from the memory budget). ``visible_max``: max(visible)
    when the caller knows it on the host (saves a device sync per call). ``reduce``: applied to
    each block's scores [R, n] before its top-k (tensor parallel: the sum over the ranks'
    indexer heads, so every rank selects the same entries)."""
    if q.dim() != 3 or weights.shape != q.shape[:2] or keys.shape[-1] != q.shape[-1]:
        raise ValueError(f"bad shapes q {tuple(q.shape)} weights {tuple(weights.shape)} keys {tuple(keys.shape)}")
    visible = visible.to(torch.int32).contiguous()
    table = table.to(torch.int32).contiguous()
    if visible_max is None:
        visible_max = int(visible.max()) if visible.numel() else 0
    out = torch.full((q.shape[0], topk), -1, dtype=torch.int32, device=q.device)
    if visible_max == 0:
        return out
    blocks = torch_blocks if backend == "torch" else triton_blocks
    scan = q.device.type == "cpu" and topk <= SCAN_TOPK_MAX  # one compiled pass a row (kernels/topk.py)
    for rows, scores in blocks(q, weights, batch, keys, table, visible, visible_max, rows_max):
        if reduce is not None:
            scores = reduce(scores)
        if scan and scores.dtype == torch.float32 and scores.is_contiguous():
            scanned_topk(scores, topk, out[rows])
        else:
            out[rows] = earliest_topk(scores, topk)
    return out
