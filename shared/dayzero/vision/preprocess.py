"""Images to pixel values like transformers' Qwen2-VL image processor (PIL backend): sides
multiples of patch x merge within [min_pixels, max_pixels] (``target_size``), bicubic resize,
CLIP mean/std, patches laid out merge-block-major.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
from PIL import Image

from .images import PatchSpec, target_size

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def patchify(image: Image.Image, spec: PatchSpec) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """RGB image -> (pixel_values [h*w, 3*T*P*P] fp32, grid (1, h, w)) in patches of ``patch_size``."""
    height, width = target_size(image.height, image.width, spec)
    pixels = np.asarray(image.resize((width, height), Image.BICUBIC), dtype=np.float64) / 255.0
    pixels = ((pixels - np.array(CLIP_MEAN)) / np.array(CLIP_STD)).astype(np.float32).transpose(2, 0, 1)
    p, m, t = spec.patch_size, spec.merge_size, spec.temporal_patch_size
    gh, gw = height // p, width // p
    patches = pixels.reshape(3, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
    patches = np.broadcast_to(patches[:, :, :, :, :, None], (*patches.shape[:5], t, p, p))
    return torch.from_numpy(np.ascontiguousarray(patches).reshape(gh * gw, 3 * t * p * p)), (1, gh, gw)


def process(images: Iterable[Image.Image], spec: PatchSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Several images -> (pixel_values [sum patches, dim], image_grid_thw [n, 3] long); given as a
    generator, each decoded image is let go once patchified."""
    parts = [patchify(image, spec) for image in images]
    return torch.cat([p for p, _ in parts]), torch.tensor([g for _, g in parts], dtype=torch.long)
