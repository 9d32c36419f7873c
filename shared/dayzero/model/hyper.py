"""Manifold-constrained hyper-connections: ``hc_mult`` residual streams per token.

Streams are [T, N, D]. Before a block they are collapsed with ``pre`` weights; after it
the block output is expanded with ``post`` and added to the streams mixed by ``comb``,
a Sinkhorn-normalised (doubly stochastic) N x N matrix. All of it runs in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..kernels.batch import Backend
from ..kernels.hyper import hyper_merge, hyper_mix
from ..kernels.hyper_cpu import collapse_cpu, fits_cpu, merge_cpu
from ..kernels.norms import rms_scale


@dataclass(frozen=True, slots=True)
class HyperMix:
    post: torch.Tensor | np.ndarray  # [T, N] (numpy: the CPU decode path's, ``collapse_cpu``)
    comb: torch.Tensor | np.ndarray  # [T, N, N]
    backend: Backend = "torch"

    def merge(self, streams: torch.Tensor, block_out: torch.Tensor) -> torch.Tensor:
        """streams [T, N, D], block_out [T, D] -> new streams [T, N, D]."""
        if isinstance(self.post, np.ndarray):  # the compiled loops' mix, merged by theirs
            return merge_cpu(streams, block_out, self.post, self.comb)
        return hyper_merge(streams, block_out, self.post, self.comb, self.backend)


def collapse(
    streams: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    iters: int,
    eps: float,
    norm_eps: float,
    backend: Backend = "torch",
) -> tuple[torch.Tensor, HyperMix]:
    """streams [T, N, D] -> (block input [T, D], the mix to apply after the block). A few fp32
    tokens on the CPU take the compiled loops from the streams to the merge (``collapse_cpu``)."""
    if backend == "torch" and fits_cpu(streams) and fn.dtype == torch.float32:
        collapsed, post, comb = collapse_cpu(streams, fn, base, scale, iters, eps, norm_eps)
        return collapsed, HyperMix(post, comb)
    flat = rms_scale(streams.flatten(1).float(), norm_eps, backend)
    mixes = F.linear(flat, fn.float())  # [T, (2 + N) * N]
    collapsed, post, comb = hyper_mix(mixes, base, scale, streams, iters, eps, backend)
    return collapsed, HyperMix(post, comb, backend)


def head_collapse(
    streams: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, eps: float, norm_eps: float
) -> torch.Tensor:
    """Final collapse of the streams before the output norm: [T, N, D] -> [T, D]."""
    flat = rms_scale(streams.flatten(1).float(), norm_eps)
    pre = torch.sigmoid(F.linear(flat, fn.float()) * scale.float() + base.float()) + eps
    return (pre.unsqueeze(-1) * streams).sum(dim=1).to(streams.dtype)
