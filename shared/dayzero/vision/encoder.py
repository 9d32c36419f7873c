"""Images -> embeddings for the language model: preprocessing, the tower, an encoder cache,
and the splice of image embeddings into a prompt's token embeddings.

The prompt carries one placeholder token per image; ``expand`` turns it into one position
per merged patch (ordinary consecutive positions), and ``splice`` puts the image rows there.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from PIL import Image
from safetensors import safe_open

from ..checkpoint_files import CheckpointError, canonical_name, weight_files
from ..telemetry import tracer
from .images import ImageLimits, PatchSpec, decode, expand
from .preprocess import process
from .tower import VisionConfig, VisionTower, encode

_VISUAL = re.compile(r"^visual\.")


@dataclass(slots=True)
class CacheCounters:
    hits: int = 0
    misses: int = 0
    tower_calls: int = 0
    cache_bytes: int = 0


class VisionEncoder:
    """Encodes images with a byte-budgeted cache keyed by the image bytes and preprocessing."""

    def __init__(self, tower: VisionTower, spec: PatchSpec, limits: ImageLimits, cache_bytes: int) -> None:
        cfg = tower.cfg
        if (cfg.patch_size, cfg.spatial_merge_size, cfg.temporal_patch_size) != (
            spec.patch_size,
            spec.merge_size,
            spec.temporal_patch_size,
        ):
            raise ValueError(f"{spec} does not cut the patches this tower takes ({cfg})")
        self.tower, self.spec, self.limits, self.budget = tower, spec, limits, cache_bytes
        self.counters = CacheCounters()
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()

    def warm_up(self) -> None:
        """One small gray image through preprocessing and the tower, neither cached nor counted: the
        first calls' costs (allocator, kernels' first launch) are not the first request's."""
        side = 2 * self.spec.patch_size * self.spec.merge_size
        pixels, grid = process([Image.new("RGB", (side, side), (128, 128, 128))], self.spec)
        encode(self.tower, pixels, grid)

    def key(self, data: bytes) -> str:
        return hashlib.sha256(data + repr(asdict(self.spec)).encode()).hexdigest()

    def embeddings(self, images: list[bytes]) -> list[torch.Tensor]:
        """One [merged patches, hidden] tensor per image; uncached images go through the tower together."""
        if len(images) > self.limits.max_images:
            raise ValueError(f"{len(images)} images in one request; the limit is {self.limits.max_images}")
        keys = [self.key(data) for data in images]
        missing = [i for i, k in enumerate(keys) if k not in self._cache]
        self.counters.hits += len(images) - len(missing)
        self.counters.misses += len(missing)
        fresh: dict[int, torch.Tensor] = {}
        if missing:
            with tracer.start_as_current_span("vision.preprocess", attributes={"dayzero.images": len(missing)}):
                decoded = (decode(images[i], self.limits, self.spec) for i in missing)  # one held at a time
                pixels, grid = process(decoded, self.spec)
            with tracer.start_as_current_span("vision.encode", attributes={"dayzero.patches": int(pixels.shape[0])}):
                merged = encode(self.tower, pixels, grid)
            self.counters.tower_calls += 1
            sizes = (grid.prod(dim=1) // self.spec.merge_size**2).tolist()
            for i, part in zip(missing, merged.split(sizes), strict=True):
                fresh[i] = part
                self._remember(keys[i], part)
        out = []
        for i, k in enumerate(keys):
            if i in fresh:
                out.append(fresh[i])
            else:
                self._cache.move_to_end(k)
                out.append(self._cache[k])
        return out

    def _remember(self, key: str, value: torch.Tensor) -> None:
        size = value.numel() * value.element_size()
        if size > self.budget:
            return
        while self.counters.cache_bytes + size > self.budget:
            _, old = self._cache.popitem(last=False)
            self.counters.cache_bytes -= old.numel() * old.element_size()
        self._cache[key] = value.clone()
        self.counters.cache_bytes += size


def splice(token_embeds: torch.Tensor, ids: list[int], image_token: int, images: list[torch.Tensor]) -> torch.Tensor:
    """Token embeddings [L, hidden] with the image rows written at the placeholder positions."""
    out = token_embeds.clone()
    rows = torch.tensor([i for i, t in enumerate(ids) if t == image_token], dtype=torch.long)
    if images:
        out[rows] = torch.cat(images).to(out.dtype)
    return out


def load_tower(path: str | Path, dtype: torch.dtype = torch.float32) -> VisionTower | None:
    """The ``visual.*`` tower of a combined checkpoint (None when it has no ``vision_config``)."""
    import json

    root = Path(path)
    raw = json.loads((root / "config.json").read_text())
    if "vision_config" not in raw:
        return None
    if raw["vision_config"].get("out_hidden_size") != raw.get("hidden_size"):
        raise CheckpointError("vision_config.out_hidden_size must equal the language model's hidden_size")
    tower = VisionTower(VisionConfig.from_dict(raw["vision_config"]))
    expected = tower.state_dict()
    tensors = {}
    for file in weight_files(root):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                name = canonical_name(key)
                if _VISUAL.match(name):
                    tensors[_VISUAL.sub("", name)] = f.get_tensor(key).to(dtype)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"vision tower: missing {missing[:3]}, unexpected {unexpected[:3]}")
    bad = [k for k, t in tensors.items() if t.shape != expected[k].shape]
    if bad:
        raise CheckpointError(
            f"vision tower tensor visual.{bad[0]} has shape {list(tensors[bad[0]].shape)}, "
            f"expected {list(expected[bad[0]].shape)}"
        )
    tower.load_state_dict(tensors, strict=True)
    return tower.eval()


def multimodal_prompt(
    embed: torch.nn.Embedding, ids: list[int], image_token: int, images: list[torch.Tensor]
) -> tuple[list[int], torch.Tensor]:
    """Prompt ids with one placeholder per image -> (expanded ids, input embeddings [L, hidden])."""
    expanded = expand(ids, image_token, [img.shape[0] for img in images])
    with torch.inference_mode():
        tokens = embed(torch.tensor(expanded, dtype=torch.long, device=embed.weight.device))
    return expanded, splice(tokens, expanded, image_token, images)
