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
from functools import lru_cache

import torch
import triton

from .attention_torch import CompressedKeys, DecodeWindow, sparse_attention_torch, sparse_decode_torch
from .attention_triton import combine_kernel, decode_split_kernel, prefill_kernel
from .batch import Backend, RaggedBatch, dot_side

HEAD_TILE = 8192  # fp32 values of one program's queries (and of its accumulator): 32 KiB


@dataclass(frozen=True, slots=True)
class _Launch:
    """What both Triton kernels take about the keys: the window ring and the compressed entries."""

    key_args: tuple  # window, its table, blocks per row, ring capacity, window size, pool, table, ...
    constants: dict  # the kernels' constexprs and pipeline depth
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
    dummy = _unused_pointer(q.device)
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
    constants = dict(D=q.shape[2], BH=_head_block(*q.shape[1:]), BN=16, BS=window.shape[1], MODE=mode)
    # no software pipelining of the key loads when a key row is wider than 1 KiB: at fp32 x 512
    # two or three stages take 192 KiB of shared memory (one: 96; bf16: 65 at any depth)
    constants["num_stages"] = 1 if window.element_size() * q.shape[2] > 1024 else 3
    return _Launch(key_args, constants, mode, k, longest)


@lru_cache(maxsize=8)
def _unused_pointer(device: torch.device) -> torch.Tensor:
    """What the kernels take for the index or prefix tensor their mode never reads (made once: a
    fresh one was an allocation and a fill on the device per layer and step)."""
    return torch.zeros(1, dtype=torch.int32, device=device)


def _head_block(heads: int, dim: int) -> int:
    """Heads per program: all of them while a block's queries and accumulator stay within
    ``HEAD_TILE`` fp32 values each (else 64 x 512 needs more shared memory than a Hopper SM
    has), at least 16 (tensor-core dots need M >= 16)."""
    return dot_side(min(heads, HEAD_TILE // dim))  # (a power of two: the head dim is one)


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
    prefill_kernel[(q.shape[0], triton.cdiv(q.shape[1], launch.constants["BH"]))](
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
    """One new token per sequence (the torch backend: up to ``FEW_ROWS``); the triton kernel splits
    the keys (flash-decoding). ``ring``: the step's window metadata, built once for all layers
    (torch backend; else built here)."""
    if backend == "torch":
        return sparse_decode_torch(q, kv, batch, window, window_table, window_size, sink, compressed, ring)
    if any(n != 1 for n in batch.news):
        raise ValueError("decode takes exactly one new token per sequence")
    launch = _launch(q, kv, window, window_table, window_size, compressed)
    n_seq, heads, dim = q.shape
    extra = {0: 0, 1: launch.slots, 2: launch.visible_max}[launch.mode]
    splits = max(1, triton.cdiv(window_size + extra, keys_per_split))
    head_blocks = triton.cdiv(heads, launch.constants["BH"])
    padded = head_blocks * launch.constants["BH"]
    m = torch.empty(n_seq, splits, padded, dtype=torch.float32, device=q.device)
    l_sum = torch.empty_like(m)
    acc = torch.empty(n_seq, splits, padded, dim, dtype=torch.float32, device=q.device)
    decode_split_kernel[(n_seq, splits, head_blocks)](
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
    return combine_splits(m, l_sum, acc, sink, heads, q.dtype, backend)


def combine_splits_torch(
    m: torch.Tensor, l_sum: torch.Tensor, acc: torch.Tensor, sink: torch.Tensor, heads: int, dtype: torch.dtype
) -> torch.Tensor:
    m, l_sum, acc = m[:, :, :heads], l_sum[:, :, :heads], acc[:, :, :heads]
    sink = sink.float().view(1, heads)
    top = torch.maximum(m.max(dim=1).values, sink)  # [B, H]
    weight = torch.exp(m - top[:, None])  # [B, S, H]
    total = (weight * l_sum).sum(dim=1) + torch.exp(sink - top)
    return ((weight[..., None] * acc).sum(dim=1) / total[..., None]).to(dtype)


def combine_splits(
    m: torch.Tensor,
    l_sum: torch.Tensor,
    acc: torch.Tensor,
    sink: torch.Tensor,
    heads: int,
    dtype: torch.dtype,
    backend: Backend = "torch",
) -> torch.Tensor:
    """The decode kernel's splits merged: running maxima ``m`` and sums ``l_sum`` [B, S, padded
    heads] fp32, accumulators ``acc`` [B, S, padded, D] fp32, the sink logit per head -> [B, heads,
    D] in ``dtype`` (the triton backend: one program per sequence and head instead of ~13 ops)."""
    if backend == "torch":
        return combine_splits_torch(m, l_sum, acc, sink, heads, dtype)
    n_seq, splits, padded, dim = acc.shape
    out = torch.empty(n_seq, heads, dim, dtype=dtype, device=acc.device)
    combine_kernel[(n_seq, heads)](
        m,
        l_sum,
        acc,
        sink.float().contiguous(),
        out,
        splits,
        heads,
        padded,
        D=dim,
        BSPLIT=max(2, triton.next_power_of_2(splits)),
    )
    return out
