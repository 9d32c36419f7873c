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
