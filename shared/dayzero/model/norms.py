"""RMS norms as the reference computes them (statistics in fp32)."""

from __future__ import annotations

from functools import lru_cache

import torch

from ..kernels.hyper_cpu import fits_cpu
from ..kernels.norms_cpu import rms_norm_cpu, rms_scale_cpu


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


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Weighted RMSNorm over the last axis; the fp32 weight multiplies before the cast back."""
    if fits_cpu(x) and weight.dtype == torch.float32:  # few fp32 tokens on the CPU: one compiled loop
        return rms_norm_cpu(x, weight, eps)
    xf = x.float()
    return (weight * (xf * _inverse_rms(xf, eps))).to(x.dtype)


def rms_scale(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Unweighted RMSNorm over the last axis."""
    if fits_cpu(x):
        return rms_scale_cpu(x, eps)
    return x * _inverse_rms(x.float(), eps).to(x.dtype)
