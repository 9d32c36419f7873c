"""Write tensors as the releases do: ``model.safetensors``, or N shards with ``model.safetensors.index.json``."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def write_shards(tensors: dict[str, torch.Tensor], out: Path, shards: int = 1) -> list[Path]:
    """Tensors split into ``shards`` files of about equal bytes, in name order (an expert's weight
    and scales may land in different shards, as in the releases); the index maps each name to its file."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    for stale in [*out.glob("model*.safetensors"), out / "model.safetensors.index.json"]:
        stale.unlink(missing_ok=True)
    if shards == 1:
        save_file(tensors, str(out / "model.safetensors"))
        return [out / "model.safetensors"]
    names = sorted(tensors)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    groups: list[list[str]] = [[] for _ in range(shards)]
    seen = 0
    for name in names:
        groups[min(shards - 1, seen * shards // max(total, 1))].append(name)
        seen += tensors[name].numel() * tensors[name].element_size()
    weight_map, files = {}, []
    for i, group in enumerate(groups):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in group}, str(out / file))
        weight_map.update(dict.fromkeys(group, file))
        files.append(out / file)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return files
