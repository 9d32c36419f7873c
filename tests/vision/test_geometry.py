"""A checkpoint's own patch geometry (patch size, merge, temporal patch) sizes its images: the
encoder's embeddings and the positions they fill against transformers' processor and tower."""

from __future__ import annotations

import io

import pytest
import torch
from PIL import Image

from dayzero.settings import Settings
from dayzero.vision.encoder import VisionEncoder
from dayzero.vision.images import PatchSpec

from .conftest import encoded, twin_towers

GEOMETRY = {"patch_size": 8, "spatial_merge_size": 3, "temporal_patch_size": 1}


def _reference(**geometry):
    return twin_towers(
        depth=2, hidden_size=16, intermediate_size=24, num_heads=2, out_hidden_size=12, window_size=48, **geometry
    )


def test_a_checkpoints_patch_geometry_sizes_its_images():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    config, model, tower = _reference(**GEOMETRY)
    settings = Settings()
    spec = settings.patch_spec(config.to_dict())
    data = encoded(150, 100, seed=3)
    got = VisionEncoder(tower, spec, settings.image_limits(), 0).embeddings([data])[0]
    processor = Qwen2VLImageProcessorPil(
        patch_size=8, merge_size=3, temporal_patch_size=1, max_pixels=settings.image_resize_max_pixels
    )
    inputs = processor(images=[Image.open(io.BytesIO(data))], return_tensors="pt")
    with torch.no_grad():
        want = model(inputs["pixel_values"], grid_thw=inputs["image_grid_thw"]).pooler_output
    assert got.shape == want.shape  # the positions the gateway expands for this image: 24 x 16 / 9
    assert (got - want).abs().max().item() < 1e-4


def test_a_spec_that_cuts_other_patches_than_the_tower_takes_is_refused():
    _, _, tower = _reference(**GEOMETRY)
    with pytest.raises(ValueError, match="does not cut the patches"):
        VisionEncoder(tower, PatchSpec(), Settings().image_limits(), 0)
