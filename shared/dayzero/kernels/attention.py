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

from .attention_triton import decode_split_kernel, prefill_kernel
from .batch import Backend, RaggedBatch

QUERY_BLOCK = 256  # query rows the torch spec attends together


@dataclass(frozen=True, slots=True)
class CompressedKeys:
    """Compressed entries a layer attends to: a pool + table, and indices or a visible count."""

    pool: torch.Tensor
    table: torch.Tensor
    indices: torch.Tensor | None = None
    visible: torch.Tensor | None = None
    visible_max: int | None = None  # max(visible), when the caller knows it on the host (no device sync)


def _ring_positions(start: int | torch.Tensor, capacity: int, device: torch.device) -> torch.Tensor:
    """Position held by each ring slot just before ``start`` (negative: never written); a start
    per sequence ([B, 1]) gives one row of slots each ([B, capacity])."""
    slot = torch.arange(capacity, device=device)
    return start - 1 - torch.remainder(start - 1 - slot, capacity)


def _entries(pool: torch.Tensor, table: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """Entries ``e`` from a block pool -> [*e.shape, D] fp32: of one sequence (``table`` its row,
    ``e`` any shape) or of every sequence (``table`` [B, cb], ``e`` [B, K])."""
    if pool.shape[0] == 0:
        return torch.zeros(*e.shape, pool.shape[-1], device=pool.device)
    bs, table = pool.shape[1], table.long()
    blocks = table[e // bs] if table.dim() == 1 else table.gather(1, e // bs)
    return pool[blocks, e % bs].float()


def _attend_block(
    q: torch.Tensor,
    pos: torch.Tensor,
    keys: torch.Tensor,
    key_pos: torch.Tensor,
    window_size: int,
    sink: torch.Tensor,
    compressed: CompressedKeys | None,
    table: torch.Tensor | None,
    rows: slice,
) -> torch.Tensor:
    """Queries q [L, H, D] at positions pos [L] of one sequence over window keys [K, D] at key_pos [K]
    (negative: never written), plus the compressed entries of ``rows`` (``table``: the sequence's
    row) and the sink -> [L, H, D] fp32."""
    delta = pos[:, None] - key_pos[None, :]
    allowed = (key_pos[None, :] >= 0) & (delta >= 0) & (delta < window_size)
    logits = torch.matmul(q.float(), keys.float().T)  # [L, H, K]
    logits = logits.masked_fill(~allowed[:, None, :], float("-inf"))
    c_logits, c_values = None, None
    if compressed is not None and compressed.indices is not None:
        sel = compressed.indices[rows].long()  # [L, K], per-query entries
        c_values = _entries(compressed.pool, table, sel.clamp(min=0))  # [L, K, D]
        c_logits = torch.bmm(q.float(), c_values.transpose(1, 2))  # [L, H, K]
        c_logits = c_logits.masked_fill((sel < 0)[:, None, :], float("-inf"))
    elif compressed is not None:
        e = torch.arange(int(compressed.visible[rows].max()), device=q.device)  # causal prefix, shared
        c_values = _entries(compressed.pool, table, e)  # [N, D]
        c_logits = torch.matmul(q.float(), c_values.T)  # [L, H, N]
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
    return result


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
    """The spec: one sequence at a time, ``QUERY_BLOCK`` of its queries at a time, explicit gathers
    and masks. A block reads the keys its window can reach: the step's rows from ``window_size - 1``
    before its first query, and the ring while that reaches before the step."""
    out = torch.empty_like(q)
    capacity = window_table.shape[1] * window.shape[1]
    for s in range(batch.num_seqs):
        row0, end, start = batch.row0s[s], batch.row0s[s] + batch.news[s], batch.starts[s]
        ring = window[window_table[s].long()].reshape(capacity, -1)
        ring_pos = _ring_positions(start, capacity, q.device)
        table = compressed.table[s] if compressed is not None else None
        for r0 in range(row0, end, QUERY_BLOCK):
            rows, first = slice(r0, min(r0 + QUERY_BLOCK, end)), max(row0, r0 - window_size + 1)
            keys, key_pos = kv[first : rows.stop], batch.positions[first : rows.stop].long()
            if first == row0:  # the block's window reaches before the step: the ring too
                keys, key_pos = torch.cat((ring, keys)), torch.cat((ring_pos, key_pos))
            pos = batch.positions[rows].long()
            block = _attend_block(q[rows], pos, keys, key_pos, window_size, sink, compressed, table, rows)
            out[rows] = block.to(q.dtype)
    return out


@dataclass(frozen=True, slots=True)
class DecodeWindow:
    """What every layer's decode step shares about the window (plan once, run per layer):
    blocks [B, wb] long ring blocks of each sequence; hidden [B, C + 1] bool, true where a ring slot
    (then the new token itself, last) is outside the sequence's window."""

    blocks: torch.Tensor
    hidden: torch.Tensor

    @staticmethod
    def build(batch: RaggedBatch, window_table: torch.Tensor, block_size: int, window_size: int) -> DecodeWindow:
        pos = batch.positions.long()[:, None]  # [B, 1] the new token's position = the sequence's start
        capacity = window_table.shape[1] * block_size
        key_pos = torch.cat((_ring_positions(pos, capacity, pos.device), pos), dim=1)  # [B, C + 1]
        delta = pos - key_pos
        return DecodeWindow(window_table.long(), (key_pos < 0) | (delta < 0) | (delta >= window_size))


def sparse_decode_torch(
    q: torch.Tensor,
    kv: torch.Tensor,
    batch: RaggedBatch,
    window: torch.Tensor,
    window_table: torch.Tensor,
    window_size: int,
    sink: torch.Tensor,
    compressed: CompressedKeys | None,
    ring: DecodeWindow | None = None,
) -> torch.Tensor:
    """``sparse_attention_torch`` for one new token per sequence, every sequence at once (the CPU
    decode path: no loop over sequences). Tested equal to the spec."""
    b, _, dim = q.shape
    ring = ring or DecodeWindow.build(batch, window_table, window.shape[1], window_size)
    values = torch.cat((window[ring.blocks].flatten(1, 2), kv[:, None]), dim=1).float()  # [B, C + 1, D]
    hidden = ring.hidden
    if compressed is not None:
        if compressed.indices is not None:
            entries = compressed.indices.long()  # [B, K], -1 = none
            unseen = entries < 0
        else:
            longest = compressed.visible_max if compressed.visible_max is not None else int(compressed.visible.max())
            entries = torch.arange(longest, device=q.device).expand(b, longest)
            unseen = entries >= compressed.visible[:, None]
        values = torch.cat((values, _entries(compressed.pool, compressed.table, entries.clamp(min=0))), dim=1)
        hidden = torch.cat((hidden, unseen), dim=1)
    logits = torch.bmm(q.float(), values.transpose(1, 2)).masked_fill_(hidden[:, None], float("-inf"))
    logits = logits.mul_(dim**-0.5)
    probs = torch.cat((logits, sink.float().view(1, -1, 1).expand(b, -1, 1)), dim=-1).softmax(dim=-1)[..., :-1]
    return torch.bmm(probs, values).to(q.dtype)


@dataclass(frozen=True, slots=True)
class _Launch:
    """What both Triton kernels take about the keys: the window ring and the compressed entries."""

    key_args: tuple  # window, its table, blocks per row, ring capacity, window size, pool, table, ...
    constants: dict  # the kernels' constexprs
    mode: int  # 0: window only, 1: entries by index, 2: a causal prefix of entries
    slots: int  # indices per query (mode 1)
    visible_max: int  # the longest per-query prefix of entries (mode 2)


def _launch(q, kv, window, window_table, window_size, compressed) -> _Launch:
    if q.dim() != 3 or kv.shape != (q.shape[0], q.shape[2]) or window.shape[-1] != q.shape[2]:
        raise ValueError(f"bad shapes q {tuple(q.shape)} kv {tuple(kv.shape)} window {tuple(window.shape)}")
    if q.shape[2] & (q.shape[2] - 1):
        raise ValueError("head_dim must be a power of two for the triton backend")
    mode, idx, vis, k, longest = 0, None, None, 0, 0
    if compressed is not None:
        if (compressed.indices is None) == (compressed.visible is None):
            raise ValueError("give exactly one of indices / visible")
        mode = 1 if compressed.indices is not None else 2
        idx = compressed.indices.to(torch.int32).contiguous() if mode == 1 else None
        vis = compressed.visible.to(torch.int32).contiguous() if mode == 2 else None
        k = idx.shape[1] if mode == 1 else 0
        if mode == 2:
            longest = compressed.visible_max if compressed.visible_max is not None else int(vis.max())
    comp = compressed.pool if compressed is not None else window
    table = compressed.table.to(torch.int32).contiguous() if compressed is not None else window_table
    dummy = torch.zeros(1, dtype=torch.int32, device=q.device)
    wt = window_table.to(torch.int32).contiguous()
    key_args = (
        window.contiguous(),
        wt,
        wt.shape[1],
        wt.shape[1] * window.shape[1],
        window_size,
        comp.contiguous(),
        table,
        table.shape[1],
        idx if idx is not None else dummy,
        vis if vis is not None else dummy,
        k,
    )
    constants = dict(D=q.shape[2], BH=max(16, triton.next_power_of_2(q.shape[1])), BN=16, BS=window.shape[1], MODE=mode)
    return _Launch(key_args, constants, mode, k, longest)


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
    launch = _launch(q, kv, window, window_table, window_size, compressed)
    q, kv = q.contiguous(), kv.contiguous()
    out = torch.empty_like(q)
    prefill_kernel[(q.shape[0],)](
        q,
        kv,
        out,
        batch.seq_of_token,
        batch.positions,
        batch.start,
        batch.row0,
        *launch.key_args,
        sink.float().contiguous(),
        q.shape[1],
        q.shape[2] ** -0.5,
        **launch.constants,
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
    ring: DecodeWindow | None = None,
) -> torch.Tensor:
    """Exactly one new token per sequence; the triton kernel splits the keys (flash-decoding).
    ``ring``: the step's window metadata, built once for all layers (torch backend; else built here)."""
    if any(n != 1 for n in batch.news):
        raise ValueError("decode takes exactly one new token per sequence")
    if backend == "torch":
        return sparse_decode_torch(q, kv, batch, window, window_table, window_size, sink, compressed, ring)
    launch = _launch(q, kv, window, window_table, window_size, compressed)
    n_seq, heads, dim = q.shape
    extra = {0: 0, 1: launch.slots, 2: launch.visible_max}[launch.mode]
    splits = max(1, triton.cdiv(window_size + extra, keys_per_split))
    bh = launch.constants["BH"]
    m = torch.empty(n_seq, splits, bh, dtype=torch.float32, device=q.device)
    l_sum = torch.empty_like(m)
    acc = torch.empty(n_seq, splits, bh, dim, dtype=torch.float32, device=q.device)
    decode_split_kernel[(n_seq, splits)](
        q.contiguous(),
        kv.contiguous(),
        m,
        l_sum,
        acc,
        batch.positions,
        *launch.key_args,
        heads,
        dim**-0.5,
        keys_per_split,
        **launch.constants,
    )
    m, l_sum, acc = m[:, :, :heads], l_sum[:, :, :heads], acc[:, :, :heads]
    sink = sink.float().view(1, heads)
    top = torch.maximum(m.max(dim=1).values, sink)  # [B, H]
    weight = torch.exp(m - top[:, None])  # [B, S, H]
    total = (weight * l_sum).sum(dim=1) + torch.exp(sink - top)
    return ((weight[..., None] * acc).sum(dim=1) / total[..., None]).to(q.dtype)
