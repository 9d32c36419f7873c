"""A checkpoint's tensors from their safetensors headers: names, shapes, dtypes, which shard.

``scan`` reads headers only (no data). With ``model.safetensors.index.json`` the index names
the shards and which tensor lives where; every tensor it lists must be in the shard it names.
``place`` maps a tensor name to the model tensor it fills (and its expert slot, and whether it
is a weight or the scales of one).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from safetensors import safe_open

_RENAMES = (
    (re.compile(r"^model\."), ""),
    (re.compile(r"^embed_tokens\.weight$"), "embed.weight"),
    (re.compile(r"^lm_head\.weight$"), "head.weight"),
    (re.compile(r"^hc_head\.hc_(fn|base|scale)$"), r"hc_head_\1"),
)
_EXPERT = re.compile(r"^((?:layers|mtp)\.\d+\.ffn\.experts)\.(\d+)\.(w[123])\.(weight|scale|weight_scale_inv)$")
_SCALE = re.compile(r"^(.+)\.(scale|weight_scale_inv)$")  # a dense weight's block scales
_MTP = re.compile(r"^mtp\.(\d+)\.")
_LOADED_APART = re.compile(r"^visual\.")  # the vision tower (dayzero.vision.encoder)


class CheckpointError(ValueError):
    """A checkpoint dayzero cannot load; the message names the file or tensor."""


def checkpoint_directory(path: str | Path) -> Path:
    """``path`` if it is a directory (a checkpoint is the directory of its config and weights)."""
    if not str(path):  # (Path("") is the working directory)
        raise CheckpointError("an empty path: give the checkpoint's directory")
    root = Path(path)
    if root.is_file():
        raise CheckpointError(f"{root} is a file: give the checkpoint's directory")
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory {root} does not exist")
    return root


@dataclass(frozen=True, slots=True)
class Entry:
    """One stored tensor: where it lives, its canonical name, shape and dtype (from the header)."""

    file: Path
    key: str
    name: str
    shape: tuple[int, ...]
    dtype_name: str  # torch's name: bfloat16, float8_e4m3fn, float8_e8m0fnu, int8, ...


@dataclass(frozen=True, slots=True)
class Placed:
    """Which model tensor an entry fills: ``role`` tensor (the values), ``mx_scale`` (packed
    experts' E8M0 scales, a tensor of their own) or ``block_scale`` (FP8 scales of ``target``)."""

    target: str
    expert: int | None
    role: str


_DTYPE_NAMES = {  # safetensors' header dtypes -> torch's names
    "BF16": "bfloat16",
    "F16": "float16",
    "F32": "float32",
    "F64": "float64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
    "I8": "int8",
    "U8": "uint8",
    "I16": "int16",
    "I32": "int32",
    "I64": "int64",
    "BOOL": "bool",
}


def canonical_name(key: str) -> str:
    for pattern, replacement in _RENAMES:
        key = pattern.sub(replacement, key)
    return key


def _index(root: Path) -> dict[str, str] | None:
    index = root / "model.safetensors.index.json"
    if not index.exists():
        return None
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{index} is not a valid safetensors index: {exc}") from exc
    missing = sorted({name for name in weight_map.values() if not (root / name).exists()})
    if missing:
        raise CheckpointError(f"{index.name} names shard(s) that do not exist: {missing}")
    return weight_map


def weight_files(root: Path) -> list[Path]:
    """The files that hold the checkpoint's tensors: the index's shards when it has one (other
    ``*.safetensors`` beside them, e.g. a consolidated copy, are not its weights), else every one."""
    weight_map = _index(root)
    files = sorted({root / n for n in weight_map.values()}) if weight_map else sorted(root.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors files in {root}")
    return files


def scan(root: Path) -> Iterator[Entry]:
    """Every tensor of the checkpoint but the vision tower's, from the headers only."""
    weight_map = _index(root)
    for file in weight_files(root):
        if file.is_dir():
            raise CheckpointError(f"{file} is a directory, not a safetensors file")
        try:
            handle = safe_open(str(file), framework="pt")
        except Exception as exc:  # safetensors raises its own error types
            raise CheckpointError(f"{file.name} is not a readable safetensors file: {exc}") from exc
        with handle as f:
            keys = set(f.keys())
            if weight_map is not None:
                absent = sorted(k for k, shard in weight_map.items() if shard == file.name and k not in keys)
                if absent:
                    raise CheckpointError(f"the index puts {absent[0]!r} in {file.name}, which does not hold it")
            for key in sorted(keys):
                name = canonical_name(key)
                if _LOADED_APART.match(name):
                    continue
                header = f.get_slice(key)
                dtype = _DTYPE_NAMES.get(header.get_dtype(), header.get_dtype())
                yield Entry(file, key, name, tuple(header.get_shape()), dtype)


def place(name: str, packed_experts: bool) -> Placed:
    """The model tensor a checkpoint tensor fills (experts stacked as ``...experts.w1 [E, ...]``)."""
    if expert := _EXPERT.match(name):
        stem, index, matrix, suffix = expert[1], int(expert[2]), expert[3], expert[4]
        if suffix == "weight":
            return Placed(f"{stem}.{matrix}", index, "tensor")
        if packed_experts:
            return Placed(f"{stem}.{matrix}_scale", index, "mx_scale")
        return Placed(f"{stem}.{matrix}", index, "block_scale")
    if scale := _SCALE.match(name):
        return Placed(f"{scale[1]}.weight", None, "block_scale")
    return Placed(name, None, "tensor")


def mtp_layers(entries: list[Entry]) -> int:
    """How many ``mtp.N`` layers the checkpoint ships (0..N-1 must all be there)."""
    found = {int(m[1]) for e in entries if (m := _MTP.match(e.name))}
    if found and found != set(range(max(found) + 1)):
        raise CheckpointError(f"MTP layers {sorted(found)} are not numbered 0..{max(found)}")
    return len(found)


def unused_patterns(names: list[str]) -> str:
    """Names grouped with their numbers as ``*``: ``layers.*.attn.extra (43)``."""
    counts = Counter(re.sub(r"\.\d+\.", ".*.", re.sub(r"\.\d+\.", ".*.", n)) for n in names)
    return ", ".join(f"{pattern} ({n})" if n > 1 else pattern for pattern, n in sorted(counts.items()))
