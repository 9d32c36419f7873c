"""Grouped expert matmul with MXFP4 weights dequantized on the fly.

  x        [M, K]         activations, rows sorted by expert
  packed   [E, N, K/2]    int8/uint8 E2M1 pairs (low nibble = even k)
  scales   [E, N, K/32]   uint8 UE8M0 exponents
  offsets  [E + 1]        int32: expert e owns rows offsets[e]:offsets[e+1] (may be empty)
out[m, n] = sum_k x[m, k] * W_e[n, k] for the expert e owning row m. Output [M, N] fp32.

And what runs the routed experts' MLP from those weights (``expert_mlp_mxfp4``): the clamped
SwiGLU between the matmuls as one kernel (``swiglu``; its twin ``expert_mlp.swiglu_torch``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..quant.formats import dequant_mxfp4
from .batch import Backend
from .expert_mlp import swiglu_torch

SWIGLU_BLOCK = 1024  # elements a program


def grouped_mxfp4_matmul_torch(
    x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    out = torch.zeros(x.shape[0], packed.shape[1], dtype=torch.float32, device=x.device)
    bounds = offsets.tolist()
    for e in range(packed.shape[0]):
        lo, hi = bounds[e], bounds[e + 1]
        if hi > lo:
            out[lo:hi] = x[lo:hi].float() @ dequant_mxfp4(packed[e], scales[e]).T
    return out


@triton.jit
def _e2m1(code):
    """E2M1 code (0..15, int32) -> fp32 value: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives."""
    mag = code & 7
    exp = mag >> 1
    man = (mag & 1).to(tl.float32)
    value = tl.where(exp == 0, 0.5 * man, tl.exp2((exp - 1).to(tl.float32)) * (1.0 + 0.5 * man))
    return tl.where(code >= 8, -value, value)


@triton.jit
def _grouped_kernel(x_ptr, w_ptr, s_ptr, off_ptr, out_ptr, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    e = tl.program_id(0)
    m_tile = tl.program_id(1)
    n_tile = tl.program_id(2)
    lo = tl.load(off_ptr + e)
    hi = tl.load(off_ptr + e + 1)
    if lo + m_tile * BM < hi:  # experts with no (or fewer) rows: nothing to do
        rows = lo + m_tile * BM + tl.arange(0, BM)
        cols = n_tile * BN + tl.arange(0, BN)
        half = tl.arange(0, BK // 2)  # byte index within the k-block: elements 2j (low), 2j+1 (high)
        row_ok = rows < hi
        col_ok = cols < N
        acc = tl.zeros([BM, BN], tl.float32)
        for k0 in range(0, K, BK):
            kk = k0 + 2 * half
            k_ok = kk < K
            x_even = tl.load(x_ptr + rows[:, None] * K + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            x_odd = tl.load(
                x_ptr + rows[:, None] * K + kk[None, :] + 1, mask=row_ok[:, None] & k_ok[None, :], other=0.0
            )
            byte = (
                tl.load(
                    w_ptr + (e * N + cols[:, None]) * (K // 2) + (k0 // 2 + half)[None, :],
                    mask=col_ok[:, None] & k_ok[None, :],
                    other=0,
                ).to(tl.int32)
                & 0xFF
            )
            exponent = (
                tl.load(
                    s_ptr + (e * N + cols[:, None]) * (K // 32) + (kk // 32)[None, :],
                    mask=col_ok[:, None] & k_ok[None, :],
                    other=127,
                ).to(tl.int32)
                & 0xFF
            )
            scale = tl.exp2((exponent - 127).to(tl.float32))
            w_even = _e2m1(byte & 0xF) * scale  # [BN, BK/2]
            w_odd = _e2m1(byte >> 4) * scale
            acc += tl.dot(x_even.to(tl.float32), tl.trans(w_even)) + tl.dot(x_odd.to(tl.float32), tl.trans(w_odd))
        tl.store(out_ptr + rows[:, None] * N + cols[None, :], acc, mask=row_ok[:, None] & col_ok[None, :])


def grouped_mxfp4_matmul(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    offsets: torch.Tensor,
    most: int,
    backend: Backend = "torch",
) -> torch.Tensor:
    """See the module docstring; no expert owns more than ``most`` rows. The triton kernel never
    materialises a dequantized weight, and its grid is sized by ``most``, not by the offsets (a
    read of them would make the host wait for the device)."""
    n_experts, n, half_k = packed.shape
    if x.shape[1] != 2 * half_k or scales.shape != (n_experts, n, 2 * half_k // 32) or offsets.numel() != n_experts + 1:
        raise ValueError(f"bad shapes x {tuple(x.shape)} packed {tuple(packed.shape)} scales {tuple(scales.shape)}")
    if backend == "torch":
        return grouped_mxfp4_matmul_torch(x, packed, scales, offsets)
    out = torch.empty(x.shape[0], n, dtype=torch.float32, device=x.device)
    bm, bn, bk = 16, 32, 64
    m_tiles = max(1, triton.cdiv(min(most, x.shape[0]), bm))  # tiles past an expert's rows end at once
    grid = (n_experts, m_tiles, triton.cdiv(n, bn))
    _grouped_kernel[grid](
        x.contiguous(),
        packed.contiguous(),
        scales.contiguous(),
        offsets.to(torch.int32),
        out,
        n,
        x.shape[1],
        BM=bm,
        BN=bn,
        BK=bk,
    )
    return out


@triton.jit
def _swiglu_kernel(gate_ptr, up_ptr, out_ptr, n, limit, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    gate = tl.minimum(tl.load(gate_ptr + i, mask=ok, other=0.0).to(tl.float32), limit)
    up = tl.load(up_ptr + i, mask=ok, other=0.0).to(tl.float32)
    up = tl.minimum(tl.maximum(up, -limit), limit)
    silu = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)  # rounded, as the twin's
    tl.store(out_ptr + i, (silu * up).to(out_ptr.dtype.element_ty), mask=ok)


def swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float, backend: Backend = "torch") -> torch.Tensor:
    """silu(min(gate, limit)) * clamp(up, -limit, limit), elementwise (the triton backend: one launch
    for the twin's four: clamp, silu, clamp, multiply)."""
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(f"bad gate {tuple(gate.shape)} {gate.dtype} / up {tuple(up.shape)} {up.dtype}")
    if backend == "torch":
        return swiglu_torch(gate, up, limit)
    gate, up = gate.contiguous(), up.contiguous()
    out = torch.empty_like(gate)
    if out.numel():
        _swiglu_kernel[(triton.cdiv(out.numel(), SWIGLU_BLOCK),)](gate, up, out, out.numel(), limit, BLOCK=SWIGLU_BLOCK)
    return out


def expert_mlp_mxfp4(
    xs: torch.Tensor, counts: torch.Tensor, most: int, packed: dict[str, torch.Tensor], limit: float, backend: Backend
) -> torch.Tensor:
    """The same from MXFP4 weights through the grouped kernel (``packed``: w1, w1_scale, ... as
    PackedExperts holds them; no expert has more than ``most`` rows): no dequantized weight is
    ever materialised, nothing is read back to the host."""
    offsets = torch.zeros(counts.numel() + 1, dtype=torch.int32, device=xs.device)
    offsets[1:] = counts.cumsum(0)
    gate = grouped_mxfp4_matmul(xs, packed["w1"], packed["w1_scale"], offsets, most, backend)
    up = grouped_mxfp4_matmul(xs, packed["w3"], packed["w3_scale"], offsets, most, backend)
    hidden = swiglu(gate, up, limit, backend)
    return grouped_mxfp4_matmul(hidden, packed["w2"], packed["w2_scale"], offsets, most, backend).to(xs.dtype)
