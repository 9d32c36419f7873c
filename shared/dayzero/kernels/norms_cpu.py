"""RMS norms as compiled CPU loops (numba) for steps of few fp32 tokens: a decode step's norm is a
few hundred numbers, so the torch twin's five ops are all of its cost (~10 us a call on this CPU,
~4 us here; a demo decode step has 30 of them). The arithmetic is the twin's, in fp32 and the same
order (the squares summed, / n, + eps, one over the square root, then the weight times the scaled
value), the sum left to right where torch's runs in vector lanes: they agree to an ulp or so; see
``kernels.norms`` for the definition and the test that holds them together.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from .batch import kept_view


@numba.njit(cache=True)
def _inverse_rms(row, eps):
    total = np.float32(0)
    for value in row:
        total += value * value
    return np.float32(1) / np.sqrt(total / np.float32(row.shape[0]) + eps)


@numba.njit(cache=True)
def _rms_norm(x, weight, eps):
    out = np.empty_like(x)
    for r in range(x.shape[0]):
        scale = _inverse_rms(x[r], eps)
        for i in range(x.shape[1]):
            out[r, i] = weight[i] * (x[r, i] * scale)
    return out


@numba.njit(cache=True)
def rms_scale_rows(x, eps):
    out = np.empty_like(x)
    for r in range(x.shape[0]):
        scale = _inverse_rms(x[r], eps)
        for i in range(x.shape[1]):
            out[r, i] = x[r, i] * scale
    return out


def weight_array(weight: torch.Tensor) -> np.ndarray:
    """The numpy view of a weight the compiled loops read every step (a norm's, a mix's base and
    scale), made once and kept on it (``kept_view``): ``.numpy()`` dispatches four aten ops (detach,
    to, resolve_conj, resolve_neg), ~130 a demo decode step for weights that never change. One that
    requires grad is not kept (``.numpy()`` refuses it, as before)."""
    return weight.numpy() if weight.requires_grad else kept_view(weight, "_host_view", (weight,), weight.numpy)


def rms_norm_cpu(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``rms_norm`` of ``x`` that ``fits_cpu`` with an fp32 ``weight``, as one loop."""
    rows = x.numpy()
    out = _rms_norm(rows.reshape(-1, rows.shape[-1]), weight_array(weight), np.float32(eps))
    return torch.from_numpy(out.reshape(rows.shape))


def rms_scale_cpu(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``rms_scale`` of ``x`` that ``fits_cpu``, as one loop (the rows shaped in numpy: torch's
    reshape and view are an aten op each)."""
    rows = x.numpy()
    return torch.from_numpy(rms_scale_rows(rows.reshape(-1, rows.shape[-1]), np.float32(eps)).reshape(rows.shape))
