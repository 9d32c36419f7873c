"""Interleaved partial RoPE: the trailing channels of each row rotated pair by pair.

  x         [T, ..., D]   any float dtype; pairs (2i, 2i+1) of the last 2 * half channels rotate
  rotation  [T, half]     complex64 (cos + i sin of each token's angles; the inverse: its conjugate)
  -> [T, ..., D] in x's dtype: the rotated pairs computed in fp32, the other channels as they were

The twin multiplies an fp32 copy of ``x`` by the rotation as complex numbers in place (three
launches for a bf16 ``x``, two for fp32); the kernel reads the row once and writes it once (a
layer rotates its queries, its KV and its output, and in CSA layers the indexer's queries). On the
CPU steps of few fp32 tokens take a compiled loop with the twin's arithmetic (``rope_cpu``).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from .batch import Backend
from .hyper_cpu import fits_cpu
from .rope_cpu import rotate_cpu


def rotate_torch(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    half = rotation.shape[-1]
    out = x.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    pairs = torch.view_as_complex(out[..., -2 * half :].unflatten(-1, (half, 2)))  # [T, ..., half]
    pairs.mul_(rotation if x.dim() == 2 else rotation.view(rotation.shape[0], *([1] * (x.dim() - 2)), half))
    return out if x.dtype == torch.float32 else out.to(x.dtype)  # (each skipped one an aten op for nothing)


@triton.jit
def _rope_kernel(x_ptr, table_ptr, out_ptr, rows_per_token, D, half, BD: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    token = row // rows_per_token
    d = tl.arange(0, BD)
    ok = d < D
    x = tl.load(x_ptr + row * D + d, mask=ok, other=0.0).to(tl.float32)
    first = D - 2 * half  # the first rotated channel
    rotated = ok & (d >= first)
    partner = tl.load(x_ptr + row * D + (d ^ 1), mask=rotated, other=0.0).to(tl.float32)  # the pair's other
    k = tl.where(rotated, (d - first) // 2, 0)
    cos = tl.load(table_ptr + (token * half + k) * 2, mask=rotated, other=1.0)
    sin = tl.load(table_ptr + (token * half + k) * 2 + 1, mask=rotated, other=0.0)
    sign = tl.where(d % 2 == 0, -1.0, 1.0)  # (a + ib)(c + is): a c - b s, then b c + a s
    out = tl.where(rotated, x * cos + sign * partner * sin, x)
    tl.store(out_ptr + row * D + d, out.to(out_ptr.dtype.element_ty), mask=ok)


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
        per_token = rows.numel() // (rows.shape[0] * dim)
        table = torch.view_as_real(rotation.contiguous())  # [T, half, 2] fp32: cos, sin
        _rope_kernel[(rows.numel() // dim,)](rows, table, out, per_token, dim, half, BD=triton.next_power_of_2(dim))
    return out
