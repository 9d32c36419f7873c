"""The torch twins of the sparse attention kernels (the spec the Triton kernels are tested
against, and the CPU path): see ``attention`` for the inputs. Prefill attends a block of a
sequence's queries at a time; decode (and any step of a few tokens per sequence) every row at once."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .batch import RaggedBatch, from_host
from .kv_write import ring_rows

QUERY_BLOCK = 256  # query rows the torch spec attends together, at most
BLOCK_LOGITS = 1 << 18  # fp32 logits [rows, heads, keys] a block aims at (1 MiB: 2x faster per row at 32k)
FEW_ROWS = 4  # new tokens per sequence up to which a step's rows attend all at once (``sparse_decode_torch``)


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
    """Entries ``e`` from a block pool -> [*e.shape, D] in the pool's type: of one sequence (``table``
    its row, ``e`` any shape) or of every sequence (``table`` [B, cb], ``e`` [B, K])."""
    if pool.shape[0] == 0:
        return pool.new_zeros(*e.shape, pool.shape[-1])
    bs, table = pool.shape[1], table.long()
    blocks = table[e // bs] if table.dim() == 1 else table.gather(1, e // bs)
    rows = (blocks * bs + e % bs).flatten()  # one index into the [blocks * bs, D] view: ~4x the speed
    return pool.reshape(-1, pool.shape[-1]).index_select(0, rows).view(*e.shape, pool.shape[-1])


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
        c_values = _entries(compressed.pool, table, sel.clamp(min=0)).float()  # [L, K, D]
        c_logits = torch.bmm(q.float(), c_values.transpose(1, 2))  # [L, H, K]
        c_logits = c_logits.masked_fill((sel < 0)[:, None, :], float("-inf"))
    elif compressed is not None:
        e = torch.arange(int(compressed.visible[rows].max()), device=q.device)  # causal prefix, shared
        c_values = _entries(compressed.pool, table, e).float()  # [N, D]
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
    """The spec: one sequence at a time, a block of its queries at a time, explicit gathers and
    masks. A block reads the keys its window can reach: the step's rows from ``window_size - 1``
    before its first query, and the ring while that reaches before the step. Blocks hold
    ``QUERY_BLOCK`` queries, fewer where the compressed entries a query reads (HCA's grow with
    the context) would make the block's logits outgrow the cache."""
    out = torch.empty_like(q)
    capacity = window_table.shape[1] * window.shape[1]
    for s in range(batch.num_seqs):
        row0, end, start = batch.row0s[s], batch.row0s[s] + batch.news[s], batch.starts[s]
        ring = window[window_table[s].long()].reshape(capacity, -1)
        ring_pos = _ring_positions(start, capacity, q.device)
        table = compressed.table[s] if compressed is not None else None
        step = _block_rows(q.shape[1], window_size, _entries_read(compressed, end - 1))
        for r0 in range(row0, end, step):
            rows, first = slice(r0, min(r0 + step, end)), max(row0, r0 - window_size + 1)
            keys, key_pos = kv[first : rows.stop], batch.positions[first : rows.stop].long()
            if first == row0:  # the block's window reaches before the step: the ring too
                keys, key_pos = torch.cat((ring, keys)), torch.cat((ring_pos, key_pos))
            pos = batch.positions[rows].long()
            block = _attend_block(q[rows], pos, keys, key_pos, window_size, sink, compressed, table, rows)
            out[rows] = block.to(q.dtype)
    return out


def _entries_read(compressed: CompressedKeys | None, row: int) -> int:
    """How many compressed entries query ``row`` reads (the most of its sequence's queries)."""
    if compressed is None:
        return 0
    return compressed.indices.shape[1] if compressed.indices is not None else int(compressed.visible[row])


def _block_rows(heads: int, window_size: int, entries: int) -> int:
    return max(1, min(QUERY_BLOCK, BLOCK_LOGITS // (heads * (2 * window_size + entries))))


@dataclass(frozen=True, slots=True)
class DecodeWindow:
    """What every layer of a step that feeds each sequence a few tokens (``FEW_ROWS`` at most:
    decode's one, a speculative verify's k + 1) shares about the window, for the torch path that
    attends every row at once (plan once, run per layer): blocks [B, wb] long ring blocks of each
    sequence; rows [B, W] long the step's rows of each sequence (W: the most new tokens of one; a
    sequence with fewer is padded with the rows after its own, hidden) and seq [T] long each row's
    sequence, both None when every sequence has one row; hidden [T, C + W] bool, true where a ring
    slot (positions before the step) or a step row is outside the row's window or after it;
    ``write_at`` [T] long, where each row goes in the ring (``kv_write.ring_rows``)."""

    blocks: torch.Tensor
    rows: torch.Tensor | None
    seq: torch.Tensor | None
    hidden: torch.Tensor
    write_at: torch.Tensor

    @staticmethod
    def build(batch: RaggedBatch, window_table: np.ndarray, block_size: int, window_size: int) -> DecodeWindow:
        """From the batch's host values and the host block table [B, wb]: numpy, not torch (the ~27
        small torch ops it took were ~5% of a demo decode step; integers and masks, so the same)."""
        width, capacity = max(batch.news), window_table.shape[1] * block_size
        if width > min(FEW_ROWS, capacity):
            raise ValueError(f"{width} new tokens in a sequence: the all-rows path takes {FEW_ROWS} at most")
        start, step = np.asarray(batch.starts, dtype=np.int64)[:, None], np.arange(width)  # [B, 1], [W]
        ring = start - 1 - np.remainder(start - 1 - np.arange(capacity), capacity)  # as _ring_positions
        key_pos = np.concatenate((ring, start + step), axis=1)  # [B, C + W]
        seq, positions = batch.host_seq, batch.host_positions  # [T]
        rows = seq_of = None
        device = batch.positions.device
        if width > 1:
            seq_of = from_host(seq.astype(np.int64), device)
            row0 = np.asarray(batch.row0s, dtype=np.int64)[:, None]
            rows = from_host(np.minimum(row0 + step, seq.shape[0] - 1), device)
            key_pos = key_pos[seq]  # [T, C + W]
        delta = positions[:, None] - key_pos  # a padding row's position is past every row's
        hidden = (key_pos < 0) | (delta < 0) | (delta >= window_size)
        blocks = window_table.astype(np.int64)
        return DecodeWindow(
            from_host(blocks, device), rows, seq_of, from_host(hidden, device), ring_rows(batch, blocks, block_size)
        )


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
    """``sparse_attention_torch`` for a few new tokens per sequence, every row of every sequence at
    once (the CPU path of decode and of a speculative verify: no loop over sequences). Tested equal
    to the spec."""
    t, _, dim = q.shape
    ring = ring or DecodeWindow.build(batch, window_table.cpu().numpy(), window.shape[1], window_size)
    step_kv = kv[:, None] if ring.rows is None else kv[ring.rows]  # [B, W, D]
    values = torch.cat((window[ring.blocks].flatten(1, 2), step_kv), dim=1)  # [B, C + W, D], the cache's type
    hidden = ring.hidden
    if ring.seq is not None:
        values = values[ring.seq]  # [T, C + W, D]
    if compressed is not None:
        table = compressed.table if ring.seq is None else compressed.table[ring.seq]
        if compressed.indices is not None:
            entries = compressed.indices.long()  # [T, K], -1 = none
            unseen = entries < 0
        else:
            longest = compressed.visible_max if compressed.visible_max is not None else int(compressed.visible.max())
            entries = torch.arange(longest, device=q.device).expand(t, longest)
            unseen = entries >= compressed.visible[:, None]
        values = torch.cat((values, _entries(compressed.pool, table, entries.clamp(min=0))), dim=1)
        hidden = torch.cat((hidden, unseen), dim=1)
    values = values.float()  # once, after the gathers (a 16-bit cache's copies stay half the size)
    logits = torch.bmm(q.float(), values.transpose(1, 2)).masked_fill_(hidden[:, None], float("-inf"))
    logits = logits.mul_(dim**-0.5)
    probs = torch.cat((logits, sink.float().view(1, -1, 1).expand(t, -1, 1)), dim=-1).softmax(dim=-1)[..., :-1]
    return torch.bmm(probs, values).to(q.dtype)
