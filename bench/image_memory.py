"""A request's large images through decoding and preprocessing: time and peak memory, every image
decoded before the first is patchified (the vision worker before) against one decoded at a time
(``VisionEncoder`` now). Eight 3160x3160 PNGs (80 MP: the default per-request budget), each variant
in a fresh process (peak RSS is per process), alternating, ``--rounds`` rounds.
Run: ``python bench/image_memory.py [--images 8] [--side 3160] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import io
import resource
import subprocess
import sys
import time

import numpy as np
from options import bench_parser
from PIL import Image

from dayzero.vision.images import ImageLimits, PatchSpec, decode
from dayzero.vision.preprocess import process

VARIANTS = ("all at once", "one at a time")


def images(count: int, side: int) -> list[bytes]:
    rng, blobs = np.random.default_rng(0), []
    for i in range(count):
        pixels = rng.integers(0, 255, (side, side, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels // (1 + i % 3)).save(buf, "PNG", compress_level=1)
        blobs.append(buf.getvalue())
    return blobs


def run(variant: str, count: int, side: int) -> None:
    blobs, limits, spec = images(count, side), ImageLimits(max_bytes=1 << 30), PatchSpec()
    before, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
    decoded = (decode(b, limits, spec) for b in blobs)
    process(list(decoded) if variant == "all at once" else decoded, spec)
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    print(f"| {variant} | {time.perf_counter() - start:.2f} | {peak:.0f} |")


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--images", type=int, default=8, help="PNGs in the request")
    parser.add_argument("--side", type=int, default=3160, help="each PNG's side, pixels (noise)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # (one process's measure)
    args = parser.parse_args()
    sizes = ["--images", str(args.images), "--side", str(args.side)]
    if args.variant:
        run(args.variant, args.images, args.side)
        return
    print("| decoding | seconds | peak RSS growth, MB |\n|---|---:|---:|", flush=True)
    for _ in range(args.rounds):
        for variant in VARIANTS:
            subprocess.run([sys.executable, __file__, "--variant", variant, *sizes], check=True)


if __name__ == "__main__":
    main()
