"""Load a DeepSeek-V4 checkpoint directory (config.json + safetensors) into dayzero's modules.

Two namings are accepted: DeepSeek's published one (``embed.weight``,
``layers.N.attn.wq_a.weight``, ``hc_head_fn``, ``head.weight``) and the one transformers
writes on save (``model.`` prefix, ``model.embed_tokens.weight``, ``model.hc_head.hc_fn``).
Headers are read first (memory-mapped, no data); any missing, unexpected or wrongly
shaped tensor fails the load with one error naming it, before any data is read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from .config import ModelConfig
from .model.weights import Transformer, is_fp32_param, skeleton

_RENAMES = (
    (re.compile(r"^model\."), ""),
    (re.compile(r"^embed_tokens\.weight$"), "embed.weight"),
    (re.compile(r"^lm_head\.weight$"), "head.weight"),
    (re.compile(r"^hc_head\.hc_(fn|base|scale)$"), r"hc_head_\1"),
)
_EXPERT = re.compile(r"^(layers\.\d+\.ffn\.experts)\.(\d+)\.(w[123])\.weight$")
_IGNORED = re.compile(r"^mtp\.")  # the multi-token-prediction layer is not served


class CheckpointError(ValueError):
    """A checkpoint dayzero cannot load; the message names the file or tensor."""


@dataclass(frozen=True, slots=True)
class Entry:
    """Where one checkpoint tensor lives and which model tensor (and expert slot) it fills."""

    file: Path
    key: str
    target: str
    expert: int | None
    shape: tuple[int, ...]


def canonical_name(key: str) -> str:
    for pattern, replacement in _RENAMES:
        key = pattern.sub(replacement, key)
    return key


def _shard_files(root: Path) -> list[Path]:
    index = root / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise CheckpointError(f"{index} is not a valid safetensors index: {exc}") from exc
        files = sorted({root / name for name in weight_map.values()})
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise CheckpointError(f"{index.name} names shard(s) that do not exist: {missing}")
        return files
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors files in {root}")
    return files


def scan(root: Path) -> Iterator[Entry]:
    """Every tensor of the checkpoint, from the headers only."""
    for file in _shard_files(root):
        try:
            handle = safe_open(str(file), framework="pt")
        except Exception as exc:  # safetensors raises its own error types
            raise CheckpointError(f"{file.name} is not a readable safetensors file: {exc}") from exc
        with handle as f:
            for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                name = canonical_name(key)
                if _IGNORED.match(name):
                    continue
                shape = tuple(f.get_slice(key).get_shape())
                expert = _EXPERT.match(name)
                if expert:
                    target = f"{expert[1]}.{expert[3]}"
                    yield Entry(file, key, target, int(expert[2]), shape)
                else:
                    yield Entry(file, key, name, None, shape)


def _check(entries: list[Entry], expected: dict[str, torch.Size]) -> None:
    problems: list[str] = []
    seen: dict[str, set[int | None]] = {}
    for e in entries:
        want = expected.get(e.target)
        if want is None:
            problems.append(f"unexpected tensor {e.key!r}")
            continue
        want_shape = tuple(want[1:]) if e.expert is not None else tuple(want)
        if e.expert is not None and not 0 <= e.expert < want[0]:
            problems.append(f"tensor {e.key!r}: expert index {e.expert} out of range [0, {want[0]})")
        elif e.shape != want_shape:
            problems.append(f"tensor {e.key!r} has shape {list(e.shape)}, expected {list(want_shape)}")
        seen.setdefault(e.target, set()).add(e.expert)
    for name, shape in expected.items():
        got = seen.get(name, set())
        if ".ffn.experts." in name:
            absent = sorted(set(range(shape[0])) - got)
            if absent:
                problems.append(f"missing tensor {name.rsplit('.', 1)[0]}.{absent[0]}.{name.rsplit('.', 1)[1]}.weight")
        elif not got:
            problems.append(f"missing tensor {name!r}")
    if problems:
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise CheckpointError(problems[0] + more)


def load_model(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", progress: bool = True
) -> Transformer:
    """Checkpoint directory -> ready ``Transformer`` (fp32 kept for norms, HC, sinks, biases)."""
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory {root} does not exist")
    cfg = ModelConfig.from_file(root)
    if cfg.raw.get("quantization_config"):
        raise CheckpointError("quantized (FP8 / FP4) checkpoints are not supported yet")
    model = skeleton(cfg)
    expected = {name: t.shape for name, t in model.state_dict().items()}
    entries = list(scan(root))
    _check(entries, expected)

    def target_dtype(name: str) -> torch.dtype:
        if name.endswith("tid2eid"):
            return torch.long
        return torch.float32 if is_fp32_param(name) else dtype

    tensors = {name: torch.empty(shape, dtype=target_dtype(name), device=device) for name, shape in expected.items()}
    by_file: dict[Path, list[Entry]] = {}
    for e in entries:
        by_file.setdefault(e.file, []).append(e)
    with tqdm(total=len(entries), desc="loading tensors", unit="t", disable=not progress, leave=False) as bar:
        for file, file_entries in by_file.items():
            with safe_open(str(file), framework="pt") as f:
                for e in file_entries:
                    dest = tensors[e.target] if e.expert is None else tensors[e.target][e.expert]
                    dest.copy_(f.get_tensor(e.key))
                    bar.update()
    model.load_state_dict(tensors, assign=True, strict=True)
    return model.eval()
