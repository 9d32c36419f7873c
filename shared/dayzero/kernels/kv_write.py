"""Write the step's new window KV rows into the ring pool.

kv [T, D]; window [blocks, bs, D]; window_table [B, wb] int32. Row t (position p of
sequence s) goes to ring slot p % (wb * bs). Only the last ``capacity`` positions of each
sequence in the step are written (earlier ones would be overwritten in the same slot).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from .batch import Backend, RaggedBatch, from_host


def ring_rows(batch: RaggedBatch, window_table: np.ndarray, block_size: int) -> torch.Tensor:
    """Where each row of the step goes in its sequence's ring, from the host block table [B, wb]:
    its row of the pool viewed as [blocks * bs, D], [T] long on the batch's device (distinct while
    no sequence has more new tokens than its ring has slots)."""
    seq, positions = batch.host_seq, batch.host_positions
    slot = positions % (window_table.shape[1] * block_size)
    rows = window_table[seq, slot // block_size].astype(np.int64) * block_size + slot % block_size
    return from_host(rows, batch.positions.device)


def write_window_torch(kv: torch.Tensor, batch: RaggedBatch, window: torch.Tensor, window_table: torch.Tensor) -> None:
    bs = window.shape[1]
    capacity = window_table.shape[1] * bs
    for s in range(batch.num_seqs):
        rows = batch.rows(s)
        end = batch.starts[s] + batch.news[s]
        keep = batch.positions[rows].long() >= end - capacity
        slot = torch.remainder(batch.positions[rows].long()[keep], capacity)
        blocks = window_table[s].long()[slot // bs]
        window[blocks, slot % bs] = kv[rows][keep]


@triton.jit
def _write_kernel(
    kv_ptr,
    win_ptr,
    table_ptr,
    seq_of_ptr,
    pos_ptr,
    start_ptr,
    new_ptr,
    win_blocks,
    capacity,
    D: tl.constexpr,
    BS: tl.constexpr,
):
    t = tl.program_id(0)
    s = tl.load(seq_of_ptr + t)
    p = tl.load(pos_ptr + t)
    end = tl.load(start_ptr + s) + tl.load(new_ptr + s)
    if p >= end - capacity:
        d = tl.arange(0, D)
        slot = p % capacity
        blk = tl.load(table_ptr + s * win_blocks + slot // BS)
        tl.store(win_ptr + (blk * BS + slot % BS) * D + d, tl.load(kv_ptr + t * D + d))


def write_window(
    kv: torch.Tensor,
    batch: RaggedBatch,
    window: torch.Tensor,
    window_table: torch.Tensor,
    backend: Backend = "torch",
    at: torch.Tensor | None = None,
) -> None:
    """In place: the ring pool ``window`` receives the rows of ``kv``. ``at``: the step's
    ``ring_rows``, found once for every layer (torch backend; else found here): one ``index_copy_``
    into the pool's rows (an ``index_put_`` by block and row was ~25% slower a call)."""
    if kv.shape[1] != window.shape[2] or kv.dtype != window.dtype or not window.is_contiguous():
        raise ValueError(f"kv {tuple(kv.shape)} {kv.dtype} does not fit window pool {tuple(window.shape)}")
    if backend == "torch" and max(batch.news) <= window_table.shape[1] * window.shape[1]:  # no slot taken twice
        rows = at if at is not None else ring_rows(batch, window_table.cpu().numpy(), window.shape[1])
        window.view(-1, window.shape[2]).index_copy_(0, rows, kv)
        return
    if backend == "torch":
        write_window_torch(kv, batch, window, window_table)
        return
    table = window_table.to(torch.int32).contiguous()
    _write_kernel[(kv.shape[0],)](
        kv.contiguous(),
        window,
        table,
        batch.seq_of_token,
        batch.positions,
        batch.start,
        batch.new,
        table.shape[1],
        table.shape[1] * window.shape[1],
        D=kv.shape[1],
        BS=window.shape[1],
    )
