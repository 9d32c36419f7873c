"""Write the step's new window KV rows into the ring pool.

kv [T, D]; window [blocks, bs, D]; window_table [B, wb] int32. Row t (position p of
sequence s) goes to ring slot p % (wb * bs). Only the last ``capacity`` positions of each
sequence in the step are written (earlier ones would be overwritten in the same slot).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .batch import Backend, RaggedBatch


def ring_slots(batch: RaggedBatch, window_table: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each row of the step goes in its sequence's ring: (block, row) [T] long (distinct
    while no sequence has more new tokens than its ring has slots)."""
    slot = torch.remainder(batch.positions.long(), window_table.shape[1] * block_size)
    blocks = window_table.long()[batch.seq_of_token.long(), torch.div(slot, block_size, rounding_mode="floor")]
    return blocks, torch.remainder(slot, block_size)


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
    at: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """In place: the ring pool ``window`` receives the rows of ``kv``. ``at``: the step's
    ``ring_slots``, found once for every layer (torch backend; else found here)."""
    if kv.shape[1] != window.shape[2] or kv.dtype != window.dtype or not window.is_contiguous():
        raise ValueError(f"kv {tuple(kv.shape)} {kv.dtype} does not fit window pool {tuple(window.shape)}")
    if backend == "torch" and max(batch.news) <= window_table.shape[1] * window.shape[1]:  # no slot taken twice
        window[at or ring_slots(batch, window_table, window.shape[1])] = kv
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
