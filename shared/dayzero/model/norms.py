"""RMS norms as the reference computes them (statistics in fp32)."""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Weighted RMSNorm over the last axis; the fp32 weight multiplies before the cast back."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    return (weight * xf).to(x.dtype)


def rms_scale(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Unweighted RMSNorm over the last axis."""
    return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)
