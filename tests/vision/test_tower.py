"""The vision tower against transformers' Qwen2_5_VisionTransformerPretrainedModel (fp32, 1e-4)."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from dayzero.vision.images import PatchSpec
from dayzero.vision.preprocess import process
from dayzero.vision.tower import VisionConfig, VisionTower, encode

from .conftest import twin_towers


def test_several_images_of_different_sizes_match_reference():
    _, reference, tower = twin_towers(
        depth=4,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=48,
        window_size=56,
        fullatt_block_indexes=[1, 3],
    )
    gen = torch.Generator().manual_seed(1)
    images = [
        Image.fromarray(torch.randint(0, 255, (h, w, 3), generator=gen, dtype=torch.uint8).numpy())
        for w, h in ((37, 91), (200, 113), (120, 300))
    ]  # windows partly filled, three grids
    pixels, grid = process(images, PatchSpec(max_pixels=28 * 28 * 64))
    with torch.no_grad():
        want = reference(pixels, grid_thw=grid).pooler_output
    got = encode(tower, pixels, grid)
    assert got.shape == want.shape == (int(grid.prod(dim=1).sum()) // 4, 48)
    assert (got - want).abs().max().item() < 1e-4 and want.abs().max().item() > 1e-2


def _checkpoint_tower(**extra):
    """A tower built as ``load_tower`` builds it: from the config.json dict a checkpoint holds."""
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    raw = dict(depth=2, hidden_size=32, intermediate_size=40, num_heads=2, out_hidden_size=24, window_size=56)
    raw.update(fullatt_block_indexes=[1], **extra)
    torch.manual_seed(0)
    reference = Qwen2_5_VisionTransformerPretrainedModel._from_config(Qwen2_5_VLVisionConfig(**raw)).eval()
    with torch.no_grad():
        for p in reference.parameters():
            p.normal_(0, 0.3)
    return raw, reference


def test_a_top_level_rope_theta_is_read_as_transformers_reads_it():
    raw, reference = _checkpoint_tower(rope_theta=100.0)  # older configs: no rope_parameters
    tower = VisionTower(VisionConfig.from_dict(raw))
    tower.load_state_dict(reference.state_dict(), strict=True)
    image = Image.fromarray(
        torch.randint(0, 255, (90, 70, 3), generator=torch.Generator().manual_seed(0)).byte().numpy()
    )
    pixels, grid = process([image], PatchSpec(max_pixels=28 * 28 * 16))
    with torch.no_grad():
        want = reference(pixels, grid_thw=grid).pooler_output
    assert (encode(tower, pixels, grid) - want).abs().max().item() < 1e-4


def test_a_vision_activation_other_than_silu_is_refused():
    raw, _ = _checkpoint_tower(hidden_act="gelu")  # transformers would use it: dayzero's MLP is SiLU-gated
    with pytest.raises(ValueError, match="hidden_act='gelu'"):
        VisionConfig.from_dict(raw)
