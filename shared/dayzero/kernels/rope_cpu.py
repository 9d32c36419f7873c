"""Interleaved partial RoPE as a compiled CPU loop (numba) for steps of few fp32 tokens: a decode
step's rotation is a few hundred numbers, so the torch twin's five ops (a copy, a slice, an
unflatten, a complex view, the multiply) are all of its cost, ~20 us a call here where a demo decode
step has 14. The arithmetic is the twin's complex multiply in fp32, each pair (a, b) by (c, s):
a c - b s and a s + b c, each product rounded, then the sum (no fused multiply-add, as torch's
vectorised complex multiply): bitwise the twin's (``tests/kernels/test_rope.py``); see
``kernels.rope`` for the definition.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch


@numba.njit(cache=True)
def _rotate(x, rotation):
    """x [T, R, D] fp32 (R rows a token), rotation [T, half] complex64 -> a rotated copy of x."""
    out = x.copy()
    tokens, rows, width = x.shape
    half = rotation.shape[1]
    first = width - 2 * half
    for t in range(tokens):
        for r in range(rows):
            for k in range(half):
                c, s = rotation[t, k].real, rotation[t, k].imag
                a, b = x[t, r, first + 2 * k], x[t, r, first + 2 * k + 1]
                out[t, r, first + 2 * k] = a * c - b * s
                out[t, r, first + 2 * k + 1] = a * s + b * c
    return out


def rotate_cpu(x: torch.Tensor, rotation: np.ndarray) -> torch.Tensor:
    """``rotate`` of ``x [T, ..., D]`` that ``fits_cpu`` by ``rotation`` [T, half] complex64 in numpy
    (the caller's kept view: ``.numpy()`` of the table is four aten ops a call), as one loop."""
    rows = x.numpy()  # [T, R, D]: R counted, not -1 (numpy cannot infer it for no tokens)
    out = _rotate(rows.reshape(rows.shape[0], math.prod(rows.shape[1:-1]), rows.shape[-1]), rotation)
    return torch.from_numpy(out.reshape(rows.shape))
