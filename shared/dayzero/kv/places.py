"""A host pool's storage as ``places``: int64 [kinds, 5] rows (address, blocks, layers, bytes
between layers, bytes of a block in a layer), what ``host_copy`` copies between (kept apart from
it: pools are planned and built where numba, which compiles the copy, is never imported)."""

from __future__ import annotations

import math

import numpy as np
import torch

PLACE_FIELDS = ("address", "blocks", "layers", "layer_stride", "block_bytes")


def places_of(tensors: list[torch.Tensor]) -> np.ndarray:
    """``places`` of pool tensors [layers, blocks, ...], each contiguous (int64 [len(tensors), 5])."""
    rows = []
    for tensor in tensors:
        if not tensor.is_contiguous() or tensor.device.type != "cpu":
            raise ValueError(f"a host pool tensor must be contiguous on the CPU, not {tensor.device} {tensor.stride()}")
        layers, blocks = tensor.shape[:2]
        block_bytes = math.prod(tensor.shape[2:]) * tensor.element_size()
        rows.append((tensor.data_ptr(), blocks, layers, blocks * block_bytes, block_bytes))
    return np.array(rows, dtype=np.int64).reshape(len(rows), len(PLACE_FIELDS))
