"""Vision tower throughput: images/s, dayzero vs transformers' Qwen2.5-VL vision model, same weights.

Preprocessing excluded (both take the same pixel_values); fp32 CPU; median of ``--runs``, square
images of ``--sides`` pixels; a tower of ``--depth`` blocks (``CONFIG``: 8).
Run: ``python bench/vision.py [--sides 224 448 672] [--runs 5] [--depth 8]``.
"""

from __future__ import annotations

import torch
from options import bench_parser
from PIL import Image
from timing import median_seconds

from dayzero.vision.images import PatchSpec
from dayzero.vision.preprocess import process
from dayzero.vision.tower import VisionConfig, VisionTower, encode

CONFIG = dict(
    depth=8,
    hidden_size=256,
    intermediate_size=512,
    num_heads=4,
    out_hidden_size=512,
    window_size=112,
    fullatt_block_indexes=[3, 7],
)


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--sides", type=int, nargs="+", default=[224, 448, 672], help="image sides, pixels")
    parser.add_argument("--runs", type=int, default=5, help="runs per median")
    parser.add_argument(
        "--depth", type=int, default=CONFIG["depth"], help="vision blocks (the last one full attention)"
    )
    args = parser.parse_args()
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    torch.manual_seed(0)
    full = sorted({i for i in CONFIG["fullatt_block_indexes"] if i < args.depth} | {args.depth - 1})
    config = Qwen2_5_VLVisionConfig(**{**CONFIG, "depth": args.depth, "fullatt_block_indexes": full})
    reference = Qwen2_5_VisionTransformerPretrainedModel._from_config(config).eval()
    tower = VisionTower(VisionConfig.from_dict(config.to_dict()))
    tower.load_state_dict(reference.state_dict(), strict=True)
    print(
        f"vision tower depth {args.depth}, width {CONFIG['hidden_size']}, fp32 CPU, "
        f"{torch.get_num_threads()} threads, median of {args.runs}"
        f" (transformers: {reference.config._attn_implementation})"
    )
    print("| image | patches | dayzero img/s | transformers img/s | ratio |")
    print("|---|---:|---:|---:|---:|")
    for side in args.sides:
        image = Image.new("RGB", (side, side), (120, 30, 200))
        pixels, grid = process([image], PatchSpec(max_pixels=side * side))
        ours = median_seconds(lambda pixels=pixels, grid=grid: encode(tower, pixels, grid), args.runs)
        with torch.inference_mode():
            theirs = median_seconds(lambda pixels=pixels, grid=grid: reference(pixels, grid_thw=grid), args.runs)
        print(f"| {side}x{side} | {pixels.shape[0]} | {1 / ours:.2f} | {1 / theirs:.2f} | {theirs / ours:.2f}x |")


if __name__ == "__main__":
    main()
