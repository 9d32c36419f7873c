"""Lightning indexer: score compressed entries per query and keep the top-k.

  q        [T, Hi, Di] roped indexer queries
  weights  [T, Hi]     per-head weights (already scaled by Hi^-0.5)
  keys     [blocks, bs, Di] index-key pool; table [B, cb] int32
  visible  [T] int32   entries below it are causal for the query
score(t, e) = sum_h weights[t, h] * relu(q[t, h] . keys[e]) * Di^-0.5, -inf when e >= visible.
The entries are scored tile by tile and merged into a running top-k, so memory is
O(T * (tile + k)) whatever the context. Ties go to the lower entry index. Output
[T, topk] int32, -1 where fewer entries are visible.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from .batch import Backend, RaggedBatch

TILE = 4096


def _weighted_scores(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """sum_h weights[x, h] * relu(q[x, h] . keys[x, n]) * Di^-0.5 -> [X, n] fp32; ``keys`` [X or 1, n, Di]."""
    scores = torch.relu(torch.matmul(q.float(), keys.float().transpose(-1, -2))) * q.shape[-1] ** -0.5
    return (scores * weights.float()[..., None]).sum(dim=1)


def indexer_scores_torch(
    q: torch.Tensor,
    weights: torch.Tensor,
    batch: RaggedBatch,
    keys: torch.Tensor,
    table: torch.Tensor,
    visible: torch.Tensor,
    first: int,
    count: int,
) -> torch.Tensor:
    """Scores of entries [first, first + count) for every query: [T, count] fp32."""
    out = torch.full((q.shape[0], count), float("-inf"), device=q.device)
    entry = torch.arange(first, first + count, device=q.device)
    for s in range(batch.num_seqs):
        rows = batch.rows(s)
        pool = keys[table[s].long()].flatten(0, 1)
        have = min(first + count, pool.shape[0]) - first
        if have <= 0:
            continue
        scores = _weighted_scores(q[rows], weights[rows], pool[None, first : first + have])  # [L, have]
        hidden = entry[None, :have] >= visible[rows, None]
        out[rows, :have] = scores.masked_fill(hidden, float("-inf"))
    return out


def indexer_scores_decode_torch(
    q: torch.Tensor,
    weights: torch.Tensor,
    batch: RaggedBatch,
    keys: torch.Tensor,
    table: torch.Tensor,
    visible: torch.Tensor,
    first: int,
    count: int,
) -> torch.Tensor:
    """``indexer_scores_torch`` for one query per sequence, every sequence at once (the CPU decode
    path). Tested equal to the spec."""
    out = torch.full((q.shape[0], count), float("-inf"), device=q.device)
    pool = keys[table.long()].flatten(1, 2)  # [B, blocks * bs, Di]
    have = min(first + count, pool.shape[1]) - first
    if have <= 0:
        return out
    scores = _weighted_scores(q, weights, pool[:, first : first + have])  # [B, have]
    entry = torch.arange(first, first + have, device=q.device)
    out[:, :have] = scores.masked_fill(entry[None, :] >= visible[:, None], float("-inf"))
    return out


@triton.jit
def _scores_kernel(
    q_ptr,
    w_ptr,
    keys_ptr,
    table_ptr,
    seq_of_ptr,
    vis_ptr,
    out_ptr,
    H,
    table_blocks,
    first,
    count,
    scale,
    D: tl.constexpr,
    BH: tl.constexpr,
    BN: tl.constexpr,
    BS: tl.constexpr,
):
    t = tl.program_id(0)
    j = tl.program_id(1) * BN + tl.arange(0, BN)
    s = tl.load(seq_of_ptr + t)
    e = first + j
    valid = (j < count) & (e < tl.load(vis_ptr + t))
    h = tl.arange(0, BH)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + (t * H + h)[:, None] * D + d[None, :], mask=(h < H)[:, None], other=0.0).to(tl.float32)
    w = tl.load(w_ptr + t * H + h, mask=h < H, other=0.0).to(tl.float32)
    blk = tl.load(table_ptr + s * table_blocks + e // BS, mask=valid, other=0)
    k = tl.load(keys_ptr + ((blk * BS + e % BS) * D)[:, None] + d[None, :], mask=valid[:, None], other=0.0)
    scores = tl.maximum(tl.dot(q, tl.trans(k.to(tl.float32))), 0.0) * scale  # [BH, BN]
    total = tl.sum(scores * w[:, None], 0)
    tl.store(out_ptr + t * count + j, tl.where(valid, total, float("-inf")), mask=j < count)


def _scores_triton(q, weights, batch, keys, table, visible, first, count):
    out = torch.empty(q.shape[0], count, dtype=torch.float32, device=q.device)
    bh = max(16, triton.next_power_of_2(q.shape[1]))
    grid = (q.shape[0], triton.cdiv(count, 16))
    _scores_kernel[grid](
        q.contiguous(),
        weights.contiguous(),
        keys.contiguous(),
        table,
        batch.seq_of_token,
        visible,
        out,
        q.shape[1],
        table.shape[1],
        first,
        count,
        q.shape[-1] ** -0.5,
        D=q.shape[-1],
        BH=bh,
        BN=16,
        BS=keys.shape[1],
    )
    return out


def indexer_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    batch: RaggedBatch,
    keys: torch.Tensor,
    table: torch.Tensor,
    visible: torch.Tensor,
    topk: int,
    backend: Backend = "torch",
    tile: int = TILE,
    visible_max: int | None = None,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """[T, topk] int32 selected entry ids (-1 = none); see the module docstring. ``visible_max``:
    max(visible) when the caller knows it on the host (saves a device sync per call).
    ``reduce``: applied to each tile's scores [T, tile] before the top-k merge (tensor
    parallel: the sum over the ranks' indexer heads, so every rank selects the same entries)."""
    if q.dim() != 3 or weights.shape != q.shape[:2] or keys.shape[-1] != q.shape[-1]:
        raise ValueError(f"bad shapes q {tuple(q.shape)} weights {tuple(weights.shape)} keys {tuple(keys.shape)}")
    visible = visible.to(torch.int32).contiguous()
    table = table.to(torch.int32).contiguous()
    scores_fn = _scores_triton
    if backend == "torch":
        decoding = all(n == 1 for n in batch.news)
        scores_fn = indexer_scores_decode_torch if decoding else indexer_scores_torch
    best = torch.full((q.shape[0], topk), float("-inf"), device=q.device)
    best_idx = torch.full((q.shape[0], topk), -1, dtype=torch.long, device=q.device)
    if backend == "torch":  # the twin materialises [T, Hi, tile] scores: keep that near 64 MiB
        tile = max(128, min(tile, (1 << 24) // max(1, q.shape[0] * q.shape[1])))
    if visible_max is None:
        visible_max = int(visible.max()) if visible.numel() else 0
    for first in range(0, visible_max, tile):
        count = min(tile, visible_max - first)
        scores = scores_fn(q, weights, batch, keys, table, visible, first, count)
        if reduce is not None:
            scores = reduce(scores)
        idx = torch.arange(first, first + count, device=q.device).expand(q.shape[0], -1)
        # running entries come first and have lower indices: a stable sort keeps ties in index order
        vals, order = torch.cat((best, scores), dim=1).sort(dim=1, descending=True, stable=True)
        best = vals[:, :topk]
        best_idx = torch.cat((best_idx, idx), dim=1).gather(1, order[:, :topk])
    invalid = (best_idx < 0) | (best_idx >= visible[:, None]) | torch.isinf(best)
    return torch.where(invalid, -1, best_idx).to(torch.int32)
