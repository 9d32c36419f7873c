from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image


def encoded(width: int, height: int, fmt: str = "PNG", mode: str = "RGB", seed: int = 0, **save) -> bytes:
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    array = rng.integers(0, 255, (height, width, channels), dtype=np.uint8)
    image = Image.fromarray(array[..., 0] if mode == "L" else array, mode)
    buf = io.BytesIO()
    image.save(buf, fmt, **save)
    return buf.getvalue()


@pytest.fixture(scope="session")
def vision_checkpoint(tmp_path_factory):
    from dayzero.demo import write_demo_checkpoint

    return write_demo_checkpoint(tmp_path_factory.mktemp("vision"), vision=True)


def twin_towers(**config):
    """transformers' Qwen2.5-VL vision model of ``config`` with random N(0, 0.1) weights, and
    dayzero's tower holding the same: (the reference's config, the reference, the tower)."""
    import torch
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    from dayzero.vision.tower import VisionConfig, VisionTower

    reference_config = Qwen2_5_VLVisionConfig(**config)
    torch.manual_seed(0)
    reference = Qwen2_5_VisionTransformerPretrainedModel._from_config(reference_config, attn_implementation="eager")
    with torch.no_grad():
        for p in reference.parameters():
            p.normal_(0, 0.1)
    tower = VisionTower(VisionConfig.from_dict(reference_config.to_dict()))
    tower.load_state_dict(reference.state_dict(), strict=True)
    return reference_config, reference.eval(), tower
