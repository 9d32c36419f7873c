"""RMS norms over the last axis, the statistics in fp32 as the reference computes them.

  x       [..., D]  any float dtype
  weight  [D]       (``rms_norm``) multiplies in fp32 before the cast back to x's dtype
  -> rms_norm:  (weight * (x * r)).to(x.dtype)      r = rsqrt(mean(x^2) + eps), from fp32 x
     rms_scale: x * r.to(x.dtype)                    (unweighted: the product in x's dtype)

The torch twin is the definition: about nine small ops a call, and a decode step has seven norms
a layer, so on a GPU they are ~60 launches a layer (~2,600 a step at V4-Flash's 43) where the
kernel is seven, a program taking consecutive rows (``batch.RowTile``: a token's heads, or several
tokens). On the CPU steps of few fp32 rows take compiled loops (``norms_cpu``) with the twin's
arithmetic.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import triton
import triton.language as tl

from .batch import Backend, RowTile
from .hyper_cpu import fits_cpu
from .norms_cpu import rms_norm_cpu, rms_scale_cpu

WIDEST_ROW = 16384  # one program holds a row (the hyper-connections' 4 x 4096 is the widest)


@lru_cache(maxsize=64)
def _constant(value: float, device: torch.device) -> torch.Tensor:
    """``value`` as a 0-dim fp32 tensor: an op given a Python number wraps and converts it on every
    call (~5 us on CPU, a tenth of a decode step's norms); fp32 arithmetic is the same either way."""
    return torch.tensor(value, dtype=torch.float32, device=device)


def _inverse_rms(xf: torch.Tensor, eps: float) -> torch.Tensor:
    """rsqrt(mean(xf^2) + eps) over the last axis of fp32 ``xf`` (the mean as sum / n, the square as
    ``xf * xf``: both bitwise the same, and ``square`` dispatches through ``pow``)."""
    total = (xf * xf).sum(-1, keepdim=True)
    return total.div_(_constant(float(xf.shape[-1]), xf.device)).add_(_constant(eps, xf.device)).rsqrt_()


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (weight * (xf * _inverse_rms(xf, eps))).to(x.dtype)


def rms_scale_torch(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * _inverse_rms(x.float(), eps).to(x.dtype)


@triton.jit
def _rms_kernel(x_ptr, weight_ptr, out_ptr, rows, D, eps, WEIGHTED: tl.constexpr, ROWS: tl.constexpr, BD: tl.constexpr):
    """Program: ROWS consecutive rows of D (a token's heads, or several tokens' rows)."""
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # [R]
    d = tl.arange(0, BD)  # [BD]
    ok = (row < rows)[:, None] & (d < D)[None, :]  # [R, BD]
    x = tl.load(x_ptr + row[:, None] * D + d[None, :], mask=ok, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)[:, None]  # [R, 1]
    if WEIGHTED:  # (the row starts [R, 1] and the weight broadcast late: fewer registers for one wide row)
        y = (x * r) * tl.load(weight_ptr + d, mask=d < D, other=0.0).to(tl.float32)[None, :]
    else:  # the scale rounded to x's dtype first, as the twin multiplies in it
        y = x * r.to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row[:, None] * D + d[None, :], y.to(out_ptr.dtype.element_ty), mask=ok)


def _launch(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    width = x.shape[-1]
    rows = x.reshape(-1, width).contiguous()
    out = torch.empty_like(rows)
    if rows.shape[0]:
        tile = RowTile.of(width, per_thread=16)
        _rms_kernel[(triton.cdiv(rows.shape[0], tile.rows),)](
            rows,
            rows if weight is None else weight.contiguous(),
            out,
            rows.shape[0],
            width,
            eps,
            WEIGHTED=weight is not None,
            ROWS=tile.rows,
            BD=tile.side,
            num_warps=tile.warps,
        )
    return out.view(x.shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, backend: Backend = "torch") -> torch.Tensor:
    """Weighted RMSNorm over the last axis (see the module docstring)."""
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"bad shapes x {tuple(x.shape)} weight {tuple(weight.shape)}")
    if backend == "triton" and x.shape[-1] <= WIDEST_ROW:
        return _launch(x, weight, eps)
    if fits_cpu(x) and weight.dtype == torch.float32:  # few fp32 tokens on the CPU: one compiled loop
        return rms_norm_cpu(x, weight, eps)
    return rms_norm_torch(x, weight, eps)


def rms_scale(x: torch.Tensor, eps: float, backend: Backend = "torch") -> torch.Tensor:
    """Unweighted RMSNorm over the last axis."""
    if backend == "triton" and x.shape[-1] <= WIDEST_ROW:
        return _launch(x, None, eps)
    if fits_cpu(x):
        return rms_scale_cpu(x, eps)
    return rms_scale_torch(x, eps)
