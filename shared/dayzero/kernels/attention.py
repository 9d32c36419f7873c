"""Sparse attention: sliding window (ring pool + the step's own rows) + compressed entries + sink.

Inputs (one layer):
  q        [T, H, D]   roped queries;  kv [T, D] the step's new (roped) KV rows, K = V
  window   [blocks, bs, D] ring pool;  window_table [B, wb] int32 (slot = position % (wb * bs))
  compressed [blocks, bs, D] entry pool; compressed_table [B, cb] int32 (entry e at block e // bs)
  indices  [T, K] int32 compressed entries per query, -1 = none   (CSA: the indexer's top-k)
  visible  [T] int32: every entry below it is attended            (HCA, or CSA with selection off)
  sink     [H] fp32 per-head sink logit
A query at position p sees window keys at positions (p - window, p]; keys before the
sequence's ``start`` come from the ring, later ones from ``kv``. Output [T, H, D].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .batch import Backend, RaggedBatch

_NEG = -1.0e30


@dataclass(frozen=True, slots=True)
class CompressedKeys:
    """Compressed entries a layer attends to: a pool + table, and indices or a visible count."""

    pool: torch.Tensor
    table: torch.Tensor
    indices: torch.Tensor | None = None
    visible: torch.Tensor | None = None


def _ring_positions(start: int, capacity: int, device: torch.device) -> torch.Tensor:
    """Position held by each ring slot just before ``start`` (negative: never written)."""
    slot = torch.arange(capacity, device=device)
    return start - 1 - torch.remainder(start - 1 - slot, capacity)


def _entries(pool: torch.Tensor, table_row: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """Entries ``e`` (any shape) of one sequence from a block pool -> [*e.shape, D] fp32."""
    if pool.shape[0] == 0:
        return torch.zeros(*e.shape, pool.shape[-1], device=pool.device)
    bs = pool.shape[1]
    return pool[table_row.long()[e // bs], e % bs].float()


def sparse_attention_torch(
    q: torch.Tensor,
    kv: torch.Tensor,
    batch: RaggedBatch,
    window: torch.Tensor,
    window_table: torch.Tensor,
    window_size: int,
    sink: torch.Tensor,
    compressed: CompressedKeys | None,
) -> torch.Tensor:
    """The spec: one sequence at a time, explicit gathers and masks."""
    out = torch.empty_like(q)
    capacity = window_table.shape[1] * window.shape[1]
    for s in range(batch.num_seqs):
        rows, start = batch.rows(s), batch.starts[s]
        pos = batch.positions[rows].long()
        ring = window[window_table[s].long()].reshape(capacity, -1)
        keys = torch.cat((ring, kv[rows]))
        key_pos = torch.cat((_ring_positions(start, capacity, q.device), pos))
        delta = pos[:, None] - key_pos[None, :]
        allowed = (key_pos[None, :] >= 0) & (delta >= 0) & (delta < window_size)
        logits = torch.matmul(q[rows].float(), keys.float().T)  # [L, H, K]
        logits = logits.masked_fill(~allowed[:, None, :], float("-inf"))
        c_logits, c_values = None, None
        if compressed is not None and compressed.indices is not None:
            sel = compressed.indices[rows].long()  # [L, K], per-query entries
            c_values = _entries(compressed.pool, compressed.table[s], sel.clamp(min=0))  # [L, K, D]
            c_logits = torch.einsum("lhd,lkd->lhk", q[rows].float(), c_values)
            c_logits = c_logits.masked_fill((sel < 0)[:, None, :], float("-inf"))
        elif compressed is not None:
            e = torch.arange(int(compressed.visible[rows].max()), device=q.device)  # causal prefix, shared
            c_values = _entries(compressed.pool, compressed.table[s], e)  # [N, D]
            c_logits = torch.matmul(q[rows].float(), c_values.T)  # [L, H, N]
            c_logits = c_logits.masked_fill((e[None, :] >= compressed.visible[rows, None])[:, None, :], float("-inf"))
        if c_logits is not None:
            logits = torch.cat((logits, c_logits), dim=-1)
        logits = logits * q.shape[-1] ** -0.5
        sinks = sink.float().view(1, -1, 1).expand(logits.shape[0], -1, 1)
        probs = torch.cat((logits, sinks), dim=-1).softmax(dim=-1)[..., :-1]
        result = torch.matmul(probs[..., : keys.shape[0]], keys.float())
        if c_values is not None:
            c_probs = probs[..., keys.shape[0] :]
            result = result + torch.matmul(c_probs, c_values)  # [L,H,K]@[L,K,D] or [L,H,N]@[N,D]
        out[rows] = result.to(q.dtype)
    return out


@triton.jit
def _online_update(m, denom, acc, q, k, valid, scale):
    scores = tl.dot(q, tl.trans(k)) * scale
    scores = tl.where(valid[None, :], scores, -1.0e30)
    m_new = tl.maximum(m, tl.max(scores, 1))
    alpha = tl.exp(m - m_new)
    p = tl.where(valid[None, :], tl.exp(scores - m_new[:, None]), 0.0)
    return m_new, denom * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p, k)


@triton.jit
def _load_keys(
    kp,
    valid,
    p,
    start,
    row0,
    s,
    kv_ptr,
    win_ptr,
    win_table_ptr,
    win_blocks,
    capacity,
    BS: tl.constexpr,
    D: tl.constexpr,
):
    """Window keys at positions ``kp``: the ring before ``start``, the step's own rows after."""
    d = tl.arange(0, D)
    in_ring = valid & (kp < start)
    slot = kp % capacity
    blk = tl.load(win_table_ptr + s * win_blocks + slot // BS, mask=in_ring, other=0)
    ring = tl.load(win_ptr + ((blk * BS + slot % BS) * D)[:, None] + d[None, :], mask=in_ring[:, None], other=0.0)
    own = valid & (kp >= start)
    new = tl.load(kv_ptr + ((row0 + kp - start) * D)[:, None] + d[None, :], mask=own[:, None], other=0.0)
    return ring.to(tl.float32) + new.to(tl.float32)


@triton.jit
def _load_entries(
    t,
    j,
    n_slots,
    s,
    idx_ptr,
    K,
    vis,
    comp_ptr,
    comp_table_ptr,
    comp_blocks,
    MODE: tl.constexpr,
    BS: tl.constexpr,
    D: tl.constexpr,
):
    """Compressed keys for slots ``j``: MODE 1 reads entry ids from ``indices``, MODE 2 is e = j < vis."""
    d = tl.arange(0, D)
    if MODE == 1:
        e = tl.load(idx_ptr + t * K + j, mask=(j >= 0) & (j < n_slots), other=-1)
        valid = e >= 0
    else:
        e = j
        valid = (j >= 0) & (j < vis)
    blk = tl.load(comp_table_ptr + s * comp_blocks + e // BS, mask=valid, other=0)
    k = tl.load(comp_ptr + ((blk * BS + e % BS) * D)[:, None] + d[None, :], mask=valid[:, None], other=0.0)
    return k.to(tl.float32), valid


@triton.jit
def _prefill_kernel(
    q_ptr,
    kv_ptr,
    out_ptr,
    seq_of_ptr,
    pos_ptr,
    start_ptr,
    row0_ptr,
    win_ptr,
    win_table_ptr,
    win_blocks,
    capacity,
    window_size,
    comp_ptr,
    comp_table_ptr,
    comp_blocks,
    idx_ptr,
    vis_ptr,
    K,
    sink_ptr,
    H,
    scale,
    D: tl.constexpr,
    BH: tl.constexpr,
    BN: tl.constexpr,
    BS: tl.constexpr,
    MODE: tl.constexpr,
):
    t = tl.program_id(0)
    s = tl.load(seq_of_ptr + t)
    p = tl.load(pos_ptr + t)
    start = tl.load(start_ptr + s)
    row0 = tl.load(row0_ptr + s)
    h = tl.arange(0, BH)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + (t * H + h)[:, None] * D + d[None, :], mask=(h < H)[:, None], other=0.0).to(tl.float32)
    m = tl.full([BH], -1.0e30, tl.float32)
    denom = tl.zeros([BH], tl.float32)
    acc = tl.zeros([BH, D], tl.float32)
    lo = tl.maximum(p - window_size + 1, 0)
    for k0 in range(lo, p + 1, BN):
        kp = k0 + tl.arange(0, BN)
        valid = kp <= p
        k = _load_keys(kp, valid, p, start, row0, s, kv_ptr, win_ptr, win_table_ptr, win_blocks, capacity, BS, D)
        m, denom, acc = _online_update(m, denom, acc, q, k, valid, scale)
    if MODE != 0:
        vis = 0
        n_slots = K
        if MODE == 2:
            vis = tl.load(vis_ptr + t)
            n_slots = vis
        for j0 in range(0, n_slots, BN):
            j = j0 + tl.arange(0, BN)
            k, valid = _load_entries(
                t, j, n_slots, s, idx_ptr, K, vis, comp_ptr, comp_table_ptr, comp_blocks, MODE, BS, D
            )
            m, denom, acc = _online_update(m, denom, acc, q, k, valid, scale)
    sink = tl.load(sink_ptr + h, mask=h < H, other=-1.0e30)
    m_new = tl.maximum(m, sink)
    alpha = tl.exp(m - m_new)
    denom = denom * alpha + tl.exp(sink - m_new)
    out = acc * alpha[:, None] / denom[:, None]
    tl.store(out_ptr + (t * H + h)[:, None] * D + d[None, :], out.to(out_ptr.dtype.element_ty), mask=(h < H)[:, None])


@triton.jit
def _decode_split_kernel(
    q_ptr,
    kv_ptr,
    m_ptr,
    l_ptr,
    acc_ptr,
    pos_ptr,
    win_ptr,
    win_table_ptr,
    win_blocks,
    capacity,
    window_size,
    comp_ptr,
    comp_table_ptr,
    comp_blocks,
    idx_ptr,
    vis_ptr,
    K,
    H,
    scale,
    keys_per_split,
    D: tl.constexpr,
    BH: tl.constexpr,
    BN: tl.constexpr,
    BS: tl.constexpr,
    MODE: tl.constexpr,
):
    """One token per sequence; split ``c`` covers virtual keys [c * kps, (c + 1) * kps):
    first the window (n_win keys ending at p), then the compressed slots."""
    s = tl.program_id(0)
    c = tl.program_id(1)
    splits = tl.num_programs(1)
    p = tl.load(pos_ptr + s)
    h = tl.arange(0, BH)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + (s * H + h)[:, None] * D + d[None, :], mask=(h < H)[:, None], other=0.0).to(tl.float32)
    n_win = tl.minimum(p + 1, window_size)
    vis = 0
    n_comp = 0
    if MODE == 1:
        n_comp = K
    if MODE == 2:
        vis = tl.load(vis_ptr + s)
        n_comp = vis
    total = n_win + n_comp
    lo = c * keys_per_split
    hi = tl.minimum(lo + keys_per_split, total)
    m = tl.full([BH], -1.0e30, tl.float32)
    denom = tl.zeros([BH], tl.float32)
    acc = tl.zeros([BH, D], tl.float32)
    for i0 in range(lo, hi, BN):
        i = i0 + tl.arange(0, BN)
        in_win = i < tl.minimum(n_win, hi)
        k = _load_keys(
            p - n_win + 1 + i, in_win, p, p, s, s, kv_ptr, win_ptr, win_table_ptr, win_blocks, capacity, BS, D
        )
        valid = in_win
        if MODE != 0:
            j = i - n_win
            kc, vc = _load_entries(s, j, n_comp, s, idx_ptr, K, vis, comp_ptr, comp_table_ptr, comp_blocks, MODE, BS, D)
            vc = vc & (j >= 0) & (i < hi)
            k = k + tl.where(vc[:, None], kc, 0.0)
            valid = valid | vc
        m, denom, acc = _online_update(m, denom, acc, q, k, valid, scale)
    base = s * splits + c
    tl.store(m_ptr + base * BH + h, m)
    tl.store(l_ptr + base * BH + h, denom)
    tl.store(acc_ptr + (base * BH + h)[:, None] * D + d[None, :], acc)


def _common(q, kv, window, window_table, compressed):
    if q.dim() != 3 or kv.shape != (q.shape[0], q.shape[2]) or window.shape[-1] != q.shape[2]:
        raise ValueError(f"bad shapes q {tuple(q.shape)} kv {tuple(kv.shape)} window {tuple(window.shape)}")
    if q.shape[2] & (q.shape[2] - 1):
        raise ValueError("head_dim must be a power of two for the triton backend")
    mode, idx, vis, k = 0, None, None, 0
    if compressed is not None:
        if (compressed.indices is None) == (compressed.visible is None):
            raise ValueError("give exactly one of indices / visible")
        mode = 1 if compressed.indices is not None else 2
        idx = compressed.indices.to(torch.int32).contiguous() if mode == 1 else None
        vis = compressed.visible.to(torch.int32).contiguous() if mode == 2 else None
        k = idx.shape[1] if mode == 1 else 0
    comp = compressed.pool if compressed is not None else window
    table = compressed.table.to(torch.int32).contiguous() if compressed is not None else window_table
    dummy = torch.zeros(1, dtype=torch.int32, device=q.device)
    return (
        mode,
        comp.contiguous(),
        table,
        table.shape[1],
        idx if idx is not None else dummy,
        vis if vis is not None else dummy,
        k,
        max(16, triton.next_power_of_2(q.shape[1])),
    )


def sparse_attention_prefill(
    q: torch.Tensor,
    kv: torch.Tensor,
    batch: RaggedBatch,
    window: torch.Tensor,
    window_table: torch.Tensor,
    window_size: int,
    sink: torch.Tensor,
    compressed: CompressedKeys | None,
    backend: Backend = "torch",
) -> torch.Tensor:
    """Any number of new tokens per sequence (prefill chunks); see the module docstring."""
    if backend == "torch":
        return sparse_attention_torch(q, kv, batch, window, window_table, window_size, sink, compressed)
    mode, comp, table, comp_blocks, idx, vis, k, bh = _common(q, kv, window, window_table, compressed)
    q, kv = q.contiguous(), kv.contiguous()
    out = torch.empty_like(q)
    wt = window_table.to(torch.int32).contiguous()
    _prefill_kernel[(q.shape[0],)](
        q,
        kv,
        out,
        batch.seq_of_token,
        batch.positions,
        batch.start,
        batch.row0,
        window.contiguous(),
        wt,
        wt.shape[1],
        wt.shape[1] * window.shape[1],
        window_size,
        comp,
        table,
        comp_blocks,
        idx,
        vis,
        k,
        sink.float().contiguous(),
        q.shape[1],
        q.shape[2] ** -0.5,
        D=q.shape[2],
        BH=bh,
        BN=16,
        BS=window.shape[1],
        MODE=mode,
    )
    return out


def sparse_attention_decode(
    q: torch.Tensor,
    kv: torch.Tensor,
    batch: RaggedBatch,
    window: torch.Tensor,
    window_table: torch.Tensor,
    window_size: int,
    sink: torch.Tensor,
    compressed: CompressedKeys | None,
    backend: Backend = "torch",
    keys_per_split: int = 256,
) -> torch.Tensor:
    """Exactly one new token per sequence; the triton kernel splits the keys (flash-decoding)."""
    if any(n != 1 for n in batch.news):
        raise ValueError("decode takes exactly one new token per sequence")
    if backend == "torch":
        return sparse_attention_torch(q, kv, batch, window, window_table, window_size, sink, compressed)
    mode, comp, table, comp_blocks, idx, vis, k, bh = _common(q, kv, window, window_table, compressed)
    n_seq, heads, dim = q.shape
    longest = window_size + (k if mode == 1 else int(vis.max()) if mode == 2 else 0)
    splits = max(1, triton.cdiv(longest, keys_per_split))
    m = torch.empty(n_seq, splits, bh, dtype=torch.float32, device=q.device)
    l_sum = torch.empty_like(m)
    acc = torch.empty(n_seq, splits, bh, dim, dtype=torch.float32, device=q.device)
    wt = window_table.to(torch.int32).contiguous()
    _decode_split_kernel[(n_seq, splits)](
        q.contiguous(),
        kv.contiguous(),
        m,
        l_sum,
        acc,
        batch.positions,
        window.contiguous(),
        wt,
        wt.shape[1],
        wt.shape[1] * window.shape[1],
        window_size,
        comp,
        table,
        comp_blocks,
        idx,
        vis,
        k,
        heads,
        dim**-0.5,
        keys_per_split,
        D=dim,
        BH=bh,
        BN=16,
        BS=window.shape[1],
        MODE=mode,
    )
    m, l_sum, acc = m[:, :, :heads], l_sum[:, :, :heads], acc[:, :, :heads]
    sink = sink.float().view(1, heads)
    top = torch.maximum(m.max(dim=1).values, sink)  # [B, H]
    weight = torch.exp(m - top[:, None])  # [B, S, H]
    total = (weight * l_sum).sum(dim=1) + torch.exp(sink - top)
    return ((weight[..., None] * acc).sum(dim=1) / total[..., None]).to(q.dtype)
