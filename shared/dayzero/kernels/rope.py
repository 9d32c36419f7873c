"""Interleaved partial RoPE: the trailing channels of each row rotated pair by pair.

  x         [T, ..., D]   any float dtype; pairs (2i, 2i+1) of the last 2 * half channels rotate
  rotation  [T, half]     complex64 (cos + i sin of each token's angles; the inverse: its conjugate)
  -> [T, ..., D] in x's dtype: the rotated pairs computed in fp32, the other channels as they were

The twin multiplies an fp32 copy of ``x`` by the rotation as complex numbers in place (three
launches for a bf16 ``x``, two for fp32); the kernel reads the row once and writes it once (a
layer rotates its queries, its KV and its output, and in CSA layers the indexer's queries). A
program takes consecutive rows, a token's heads or several tokens (``batch.RowTile``). On the CPU
steps of few fp32 tokens take a compiled loop with the twin's arithmetic (``rope_cpu``).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from .batch import Backend, RowTile
from .hyper_cpu import fits_cpu
from .rope_cpu import rotate_cpu


def rotate_torch(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    half = rotation.shape[-1]
    out = x.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    pairs = torch.view_as_complex(out[..., -2 * half :].unflatten(-1, (half, 2)))  # [T, ..., half]
    pairs.mul_(rotation if x.dim() == 2 else rotation.view(rotation.shape[0], *([1] * (x.dim() - 2)), half))
    return out if x.dtype == torch.float32 else out.to(x.dtype)  # (each skipped one an aten op for nothing)


@triton.jit
def _rope_kernel(x_ptr, table_ptr, out_ptr, rows, rows_per_token, D, half, ROWS: tl.constexpr, BD: tl.constexpr):
    """Program: ROWS consecutive rows of D channels (a token's heads, or several tokens' rows)."""
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # [R]
    d = tl.arange(0, BD)  # [BD]
    first = D - 2 * half  # the first rotated channel
    rotated = (d >= first) & (d < D)
    ok = (row < rows)[:, None] & (d < D)[None, :]  # [R, BD]
    at = row[:, None] * D + d[None, :]
    x = tl.load(x_ptr + at, mask=ok, other=0.0).to(tl.float32)
    turn = ok & rotated[None, :]
    partner = tl.load(x_ptr + (at ^ 1), mask=turn, other=0.0).to(tl.float32)  # the pair's other (D is even)
    angle = (row // rows_per_token * half)[:, None] + tl.where(rotated, (d - first) // 2, 0)[None, :]
    cos = tl.load(table_ptr + angle * 2, mask=turn, other=1.0)
    sin = tl.load(table_ptr + angle * 2 + 1, mask=turn, other=0.0)
    sign = tl.where(d % 2 == 0, -1.0, 1.0)[None, :]  # (a + ib)(c + is): a c - b s, then b c + a s
    out = tl.where(turn, x * cos + sign * partner * sin, x)
    tl.store(out_ptr + at, out.to(out_ptr.dtype.element_ty), mask=ok)


def rotate(
    x: torch.Tensor, rotation: torch.Tensor, backend: Backend = "torch", host: np.ndarray | None = None
) -> torch.Tensor:
    """``x`` with its trailing pairs rotated by ``rotation`` (see the module docstring); ``host``:
    the caller's numpy view of a CPU ``rotation``, kept for every call of a step (``.numpy()`` is
    four aten ops)."""
    half, dim = rotation.shape[-1], x.shape[-1]
    if rotation.shape[0] != x.shape[0] or 2 * half > dim or dim % 2:
        raise ValueError(f"bad shapes x {tuple(x.shape)} rotation {tuple(rotation.shape)}")
    if backend == "torch":
        if fits_cpu(x):  # few fp32 tokens on the CPU: one compiled loop
            return rotate_cpu(x, rotation.numpy() if host is None else host)
        return rotate_torch(x, rotation)
    rows = x.contiguous()
    out = torch.empty_like(rows)
    if rows.numel():
        count = rows.numel() // dim
        tile = RowTile.of(dim, per_thread=8)
        table = torch.view_as_real(rotation.contiguous())  # [T, half, 2] fp32: cos, sin
        _rope_kernel[(triton.cdiv(count, tile.rows),)](
            rows,
            table,
            out,
            count,
            count // rows.shape[0],
            dim,
            half,
            ROWS=tile.rows,
            BD=tile.side,
            num_warps=tile.warps,
        )
    return out
