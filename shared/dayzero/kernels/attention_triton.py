"""Triton kernels of sparse attention (spec and host functions: attention.py).

Both keep an online softmax over blocks of keys: the window (ring pool before the
sequence's start, the step's own rows after it), then the compressed entries (by index or
a causal prefix), then the sink. A program takes a block of ``BH`` heads (the host picks it so
that a block's queries and accumulator fit: 16 of DeepSeek-V4-Flash's 64 x 512). The decode
kernel also splits each sequence's keys over programs (flash-decoding); ``combine_kernel``
merges the splits' partial results with the sink.
"""

import triton
import triton.language as tl


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
def prefill_kernel(
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
    h = tl.program_id(1) * BH + tl.arange(0, BH)
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
def decode_split_kernel(
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
    padded = tl.num_programs(2) * BH  # heads rounded up to whole head blocks
    h = tl.program_id(2) * BH + tl.arange(0, BH)
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
    tl.store(m_ptr + base * padded + h, m)
    tl.store(l_ptr + base * padded + h, denom)
    tl.store(acc_ptr + (base * padded + h)[:, None] * D + d[None, :], acc)


@triton.jit
def combine_kernel(
    m_ptr, l_ptr, acc_ptr, sink_ptr, out_ptr, splits, heads, padded, D: tl.constexpr, BSPLIT: tl.constexpr
):
    """One (sequence, head): the splits' running maxima ``m``, sums ``l`` and accumulators
    [splits, D] (of ``padded`` heads) merged with the sink logit into the output row [D]."""
    b, h = tl.program_id(0), tl.program_id(1)
    s = tl.arange(0, BSPLIT)
    ok = s < splits
    at = (b * splits + s) * padded + h
    m = tl.load(m_ptr + at, mask=ok, other=-1.0e30)
    sink = tl.load(sink_ptr + h)
    top = tl.maximum(tl.max(m, 0), sink)
    weight = tl.where(ok, tl.exp(m - top), 0.0)
    total = tl.sum(weight * tl.load(l_ptr + at, mask=ok, other=0.0), 0) + tl.exp(sink - top)
    d = tl.arange(0, D)
    acc = tl.load(acc_ptr + at[:, None] * D + d[None, :], mask=ok[:, None], other=0.0)
    out = tl.sum(weight[:, None] * acc, 0) / total
    tl.store(out_ptr + (b * heads + h) * D + d, out.to(out_ptr.dtype.element_ty))
