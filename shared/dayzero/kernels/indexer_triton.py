"""The indexer's scores as a Triton kernel (the module docstring of indexer.py defines them; its
torch twin, the spec: indexer_torch.py): one program scores ``BN`` entries for one row, every head
in one dot, and the backend's blocks of rows (``triton_blocks``), one launch each."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .batch import dot_side
from .indexer_torch import BUDGET


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
    BD: tl.constexpr,
    BH: tl.constexpr,
    BN: tl.constexpr,
    BS: tl.constexpr,
):
    """Scores of ``BN`` entries for one row; ``BD``: ``D`` padded (masked) to a power of two >= 16,
    as tensor-core dots need K >= 16."""
    t = tl.program_id(0)
    j = tl.program_id(1) * BN + tl.arange(0, BN)
    s = tl.load(seq_of_ptr + t)
    e = first + j
    valid = (j < count) & (e < tl.load(vis_ptr + t))
    h = tl.arange(0, BH)
    d = tl.arange(0, BD)
    q_ok = (h < H)[:, None] & (d < D)[None, :]
    q = tl.load(q_ptr + (t * H + h)[:, None] * D + d[None, :], mask=q_ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + t * H + h, mask=h < H, other=0.0).to(tl.float32)
    blk = tl.load(table_ptr + s * table_blocks + e // BS, mask=valid, other=0)
    k_ok = valid[:, None] & (d < D)[None, :]
    k = tl.load(keys_ptr + ((blk * BS + e % BS) * D)[:, None] + d[None, :], mask=k_ok, other=0.0)
    scores = tl.maximum(tl.dot(q, tl.trans(k.to(tl.float32))), 0.0) * scale  # [BH, BN]
    total = tl.sum(scores * w[:, None], 0)
    tl.store(out_ptr + t * count + j, tl.where(valid, total, float("-inf")), mask=j < count)


def _scores_triton(q, weights, seq_of, keys, table, visible, count):
    """Scores of entries [0, count) for the given rows: [R, count] fp32."""
    out = torch.empty(q.shape[0], count, dtype=torch.float32, device=q.device)
    bh = dot_side(q.shape[1])
    grid = (q.shape[0], triton.cdiv(count, 16))
    _scores_kernel[grid](
        q.contiguous(),
        weights.contiguous(),
        keys.contiguous(),
        table,
        seq_of.contiguous(),
        visible.contiguous(),
        out,
        q.shape[1],
        table.shape[1],
        0,
        count,
        q.shape[-1] ** -0.5,
        D=q.shape[-1],
        BD=dot_side(q.shape[-1]),
        BH=bh,
        BN=16,
        BS=keys.shape[1],
    )
    return out


def triton_blocks(q, weights, batch, keys, table, visible, visible_max, rows_max):
    """(rows, scores [R, visible_max]) per block of ``BUDGET`` scores, every sequence's rows together."""
    step = rows_max or max(1, BUDGET // max(1, visible_max))
    for r0 in range(0, q.shape[0], step):
        rows = slice(r0, min(r0 + step, q.shape[0]))
        seq_of = batch.seq_of_token[rows]
        yield rows, _scores_triton(q[rows], weights[rows], seq_of, keys, table, visible[rows], visible_max)
