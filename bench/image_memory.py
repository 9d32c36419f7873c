"""A request's large images through decoding and preprocessing: time and peak memory, every image
decoded before the first is patchified (the vision worker before) against one decoded at a time
(``VisionEncoder`` now). Eight 3160x3160 PNGs (80 MP: the default per-request budget), each variant
in a fresh process (peak RSS is per process), alternating, two rounds.
Run: ``python bench/image_memory.py``.
"""

from __future__ import annotations

import io
import resource
import subprocess
import sys
import time

import numpy as np
from PIL import Image

from dayzero.vision.images import ImageLimits, PatchSpec, decode
from dayzero.vision.preprocess import process


def images() -> list[bytes]:
    rng, blobs = np.random.default_rng(0), []
    for i in range(8):
        pixels = rng.integers(0, 255, (3160, 3160, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels // (1 + i % 3)).save(buf, "PNG", compress_level=1)
        blobs.append(buf.getvalue())
    return blobs


def run(variant: str) -> None:
    blobs, limits, spec = images(), ImageLimits(max_bytes=1 << 30), PatchSpec()
    before, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
    decoded = (decode(b, limits, spec) for b in blobs)
    process(list(decoded) if variant == "all at once" else decoded, spec)
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    print(f"| {variant} | {time.perf_counter() - start:.2f} | {peak:.0f} |")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        run(sys.argv[1])
    else:
        print("| decoding | seconds | peak RSS growth, MB |\n|---|---:|---:|", flush=True)
        for _ in range(2):
            for variant in ("all at once", "one at a time"):
                subprocess.run([sys.executable, __file__, variant], check=True)
