"""Compressor pooling: fold windows of projected tokens into entries and append them to a pool.

  kv, gate   [n, S, D]  each new entry's source rows (gate with the position bias added;
                        -inf rows take no part). S = rate, or 2 * rate for overlapping CSA.
  norm       [D] fp32   RMSNorm weight;  cos, sin [n, R/2] RoPE at each entry's position
  pool       [blocks, bs, D]; table [B, cb] int32; seq [n], entry [n] int32: destination
entry = rope(rmsnorm(sum_rows softmax_rows(gate) * kv)), RoPE on the trailing R channels
(interleaved pairs). Written to pool[table[seq, entry // bs], entry % bs].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .batch import Backend


def pool_entries_torch(
    kv: torch.Tensor, gate: torch.Tensor, norm: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float
) -> torch.Tensor:
    """The entries themselves [n, D] fp32 (the spec of the kernel's arithmetic)."""
    pooled = (kv.float() * gate.float().softmax(dim=1)).sum(dim=1)
    pooled = pooled * torch.rsqrt(pooled.square().mean(-1, keepdim=True) + eps) * norm.float()
    half = cos.shape[-1]
    rope = pooled[:, -2 * half :]
    even, odd = rope[:, 0::2], rope[:, 1::2]
    rotated = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)
    return torch.cat((pooled[:, : -2 * half], rotated), dim=-1)


def compress_entries_torch(kv, gate, norm, cos, sin, eps, pool, table, seq, entry) -> None:
    out = pool_entries_torch(kv, gate, norm, cos, sin, eps)
    bs = pool.shape[1]
    blocks = table[seq.long(), entry.long() // bs].long()
    pool[blocks, entry.long() % bs] = out.to(pool.dtype)


@triton.jit
def _pool_channels(kv_ptr, gate_ptr, base, channels, row_ok):
    """Softmax-over-rows weighted sum for the given channels: [n_channels]."""
    offs = base + channels[None, :]
    g = tl.load(gate_ptr + offs, mask=row_ok, other=float("-inf")).to(tl.float32)
    x = tl.load(kv_ptr + offs, mask=row_ok, other=0.0).to(tl.float32)
    g = tl.exp(g - tl.max(g, 0)[None, :])
    return tl.sum(g * x, 0) / tl.sum(g, 0)


@triton.jit
def _compress_kernel(
    kv_ptr,
    gate_ptr,
    norm_ptr,
    cos_ptr,
    sin_ptr,
    pool_ptr,
    table_ptr,
    seq_ptr,
    entry_ptr,
    S,
    table_blocks,
    eps,
    D: tl.constexpr,
    R: tl.constexpr,
    BR: tl.constexpr,
    BS: tl.constexpr,
):
    i = tl.program_id(0)
    r = tl.arange(0, BR)
    j = tl.arange(0, D // 2)  # channel pairs (2j, 2j + 1)
    row_ok = (r < S)[:, None]
    base = i * S * D + r[:, None] * D
    even = _pool_channels(kv_ptr, gate_ptr, base, 2 * j, row_ok)
    odd = _pool_channels(kv_ptr, gate_ptr, base, 2 * j + 1, row_ok)
    rstd = 1.0 / tl.sqrt((tl.sum(even * even, 0) + tl.sum(odd * odd, 0)) / D + eps)
    even = even * rstd * tl.load(norm_ptr + 2 * j)
    odd = odd * rstd * tl.load(norm_ptr + 2 * j + 1)
    rj = j - (D - R) // 2
    in_rope = rj >= 0
    c = tl.load(cos_ptr + i * (R // 2) + rj, mask=in_rope, other=1.0)
    s_ = tl.load(sin_ptr + i * (R // 2) + rj, mask=in_rope, other=0.0)
    new_even = even * c - odd * s_
    new_odd = odd * c + even * s_
    seq = tl.load(seq_ptr + i)
    e = tl.load(entry_ptr + i)
    blk = tl.load(table_ptr + seq * table_blocks + e // BS)
    dest = pool_ptr + (blk * BS + e % BS) * D
    tl.store(dest + 2 * j, new_even.to(pool_ptr.dtype.element_ty))
    tl.store(dest + 2 * j + 1, new_odd.to(pool_ptr.dtype.element_ty))


def compress_entries(
    kv: torch.Tensor,
    gate: torch.Tensor,
    norm: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    pool: torch.Tensor,
    table: torch.Tensor,
    seq: torch.Tensor,
    entry: torch.Tensor,
    backend: Backend = "torch",
) -> None:
    """In place: append the pooled entries to ``pool``; see the module docstring."""
    n, rows, dim = kv.shape
    if gate.shape != kv.shape or pool.shape[-1] != dim or cos.shape != (n, sin.shape[1]) or not pool.is_contiguous():
        raise ValueError(f"bad shapes kv {tuple(kv.shape)} gate {tuple(gate.shape)} pool {tuple(pool.shape)}")
    if n == 0:
        return
    if backend == "torch":
        compress_entries_torch(kv, gate, norm, cos, sin, eps, pool, table, seq, entry)
        return
    _compress_kernel[(n,)](
        kv.contiguous(),
        gate.contiguous(),
        norm.float().contiguous(),
        cos.contiguous(),
        sin.contiguous(),
        pool,
        table.to(torch.int32).contiguous(),
        seq.to(torch.int32).contiguous(),
        entry.to(torch.int32).contiguous(),
        rows,
        table.shape[1],
        eps,
        D=dim,
        R=2 * cos.shape[1],
        BR=triton.next_power_of_2(rows),
        BS=pool.shape[1],
    )
