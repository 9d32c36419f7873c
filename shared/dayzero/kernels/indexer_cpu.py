"""The indexer's head sum as compiled CPU loops (numba): sum_h w[h] * relu(scores[h]) in one pass
over the per-head scores, where torch makes two or three (relu, the matvec, and for bf16 products
the copy to fp32), each over the whole block of scores: for one query at 64k tokens that block is
[16384 entries, 64 heads], 4 MiB a pass in fp32 (0.3 vs 0.95 ms here; bf16 0.2-0.3 vs 1.1 ms). bf16
scores are widened by their bits (a bf16 is the high half of an fp32). The heads are summed in
fp32, in vector lanes (reassociated: the order of the sum is not torch's); relu is max(s, 0).
"""

from __future__ import annotations

import numba
import numpy as np
import torch


@numba.njit(cache=True, fastmath={"reassoc", "contract"})
def _weighted_relu(values, weights):
    total = np.float32(0)
    for h in range(values.shape[0]):
        total += weights[h] * max(values[h], np.float32(0))
    return total


@numba.njit(cache=True)
def _rows_f32(heads, weights, scale):
    out = np.empty(heads.shape[0], np.float32)
    for n in range(heads.shape[0]):
        out[n] = _weighted_relu(heads[n], weights) * scale
    return out


@numba.njit(cache=True)
def _rows_bf16(bits, weights, scale):
    out = np.empty(bits.shape[0], np.float32)
    wide = np.empty(bits.shape[1], np.uint32)
    values = wide.view(np.float32)
    for n in range(bits.shape[0]):
        for h in range(bits.shape[1]):
            wide[h] = np.uint32(np.uint16(bits[n, h])) << np.uint32(16)
        out[n] = _weighted_relu(values, weights) * scale
    return out


def weighted_relu_rows(heads: torch.Tensor, weights: torch.Tensor, scale: float) -> torch.Tensor:
    """[n, Hi] per-head scores (fp32 or bf16, contiguous), [Hi] weights -> [n] fp32
    ``scale * sum_h weights[h] * relu(heads[:, h])``."""
    w = weights.float().numpy()
    if heads.dtype == torch.bfloat16:
        return torch.from_numpy(_rows_bf16(heads.view(torch.int16).numpy(), w, np.float32(scale)))
    return torch.from_numpy(_rows_f32(heads.numpy(), w, np.float32(scale)))
