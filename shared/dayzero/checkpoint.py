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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from .config import ModelConfig
from .model.weights import Transformer, is_fp32_param, skeleton
from .quant.experts import ExpertConverter
from .quant.formats import FormatError, dequant_fp8

_RENAMES = (
    (re.compile(r"^model\."), ""),
    (re.compile(r"^embed_tokens\.weight$"), "embed.weight"),
    (re.compile(r"^lm_head\.weight$"), "head.weight"),
    (re.compile(r"^hc_head\.hc_(fn|base|scale)$"), r"hc_head_\1"),
)
_EXPERT = re.compile(r"^(layers\.\d+\.ffn\.experts)\.(\d+)\.(w[123])\.(weight|scale|weight_scale_inv)$")
_SCALE = re.compile(r"^(.+)\.(scale|weight_scale_inv)$")  # a dense weight's block scales
_IGNORED = re.compile(r"^(mtp|visual)\.")  # the MTP layer is not served; the vision tower loads apart


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
    dense_scale: bool = False  # block scales of the dense weight ``target``
    dtype: str = ""


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
                header = f.get_slice(key)
                shape, dtype = tuple(header.get_shape()), header.get_dtype()
                expert, scale = _EXPERT.match(name), _SCALE.match(name)
                if expert:
                    suffix = "" if expert[4] == "weight" else "_scale"
                    yield Entry(file, key, f"{expert[1]}.{expert[3]}{suffix}", int(expert[2]), shape, dtype=dtype)
                elif scale:
                    yield Entry(file, key, f"{scale[1]}.weight", None, shape, dense_scale=True, dtype=dtype)
                else:
                    yield Entry(file, key, name, None, shape, dtype=dtype)


def _check(entries: list[Entry], expected: dict[str, torch.Size]) -> None:
    problems: list[str] = []
    seen: dict[str, set[int | None]] = {}
    for e in entries:
        if e.dense_scale:
            if e.target not in expected:
                problems.append(f"unexpected tensor {e.key!r} (scales of no known weight)")
            continue
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


def packed_experts(cfg: ModelConfig) -> bool:
    """Whether the checkpoint's experts are MXFP4 (kept packed); refuses formats dayzero cannot read."""
    q = cfg.raw.get("quantization_config")
    if not q:
        return False
    if q.get("quant_method") != "fp8":
        raise CheckpointError(
            f"quantization_config quant_method {q.get('quant_method')!r} is not supported "
            "(supported: 'fp8' with FP4 experts)"
        )
    if q.get("scale_fmt", "float") not in ("ue8m0", "float"):
        raise CheckpointError(f"quantization_config scale_fmt {q.get('scale_fmt')!r} is not supported")
    if q.get("expert_dtype", "fp8") != "fp4":
        raise CheckpointError(
            f"quantization_config expert_dtype {q.get('expert_dtype', 'fp8')!r} is not supported "
            "(dayzero serves FP4 = MXFP4 experts)"
        )
    return True


def _read(f, e: Entry, scales: dict[str, torch.Tensor], packed: bool) -> torch.Tensor:
    """One tensor as stored, FP8 dense weights dequantized with their block scales."""
    tensor = f.get_tensor(e.key)
    if tensor.dtype == torch.float8_e4m3fn:
        if e.target not in scales:
            raise CheckpointError(f"tensor {e.key!r} is FP8 but the checkpoint has no scales for it")
        try:
            return dequant_fp8(tensor, scales[e.target], e.key)
        except FormatError as exc:
            raise CheckpointError(str(exc)) from exc
    if packed and e.expert is not None and e.target.endswith(("w1", "w2", "w3")) and tensor.dtype.is_floating_point:
        raise CheckpointError(f"tensor {e.key!r}: expected FP4 (int8-packed E2M1) expert weights, got {tensor.dtype}")
    return tensor


def load_model(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    progress: bool = True,
    expert_cache_bytes: int = 0,
    on_progress: Callable[[int, int], None] | None = None,
) -> Transformer:
    """Checkpoint directory -> ready ``Transformer`` (fp32 kept for norms, HC, sinks, biases).

    FP8 dense weights are dequantized to ``dtype`` at load; FP4 experts stay packed and are
    converted per call (``expert_cache_bytes`` of hot experts kept dequantized).
    ``progress``: a progress bar on stderr; ``on_progress(done, total)`` after each tensor.
    """
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory {root} does not exist")
    cfg = ModelConfig.from_file(root)
    packed = packed_experts(cfg)
    model = skeleton(cfg, packed)
    expected = {name: t.shape for name, t in model.state_dict().items()}
    entries = list(scan(root))
    _check(entries, expected)
    layout = {name: t.dtype for name, t in model.state_dict().items()}

    def target_dtype(name: str) -> torch.dtype:
        if layout[name] in (torch.int8, torch.uint8, torch.long):
            return layout[name]
        return torch.float32 if is_fp32_param(name) else dtype

    tensors = {name: torch.empty(shape, dtype=target_dtype(name), device=device) for name, shape in expected.items()}
    by_file: dict[Path, list[Entry]] = {}
    for e in entries:
        by_file.setdefault(e.file, []).append(e)
    scales: dict[str, torch.Tensor] = {}
    for file, file_entries in by_file.items():
        with safe_open(str(file), framework="pt") as f:
            scales.update({e.target: f.get_tensor(e.key) for e in file_entries if e.dense_scale})
    done = 0
    with tqdm(total=len(entries), desc="loading tensors", unit="t", disable=not progress, leave=False) as bar:
        for file, file_entries in by_file.items():
            with safe_open(str(file), framework="pt") as f:
                for e in file_entries:
                    if not e.dense_scale:
                        dest = tensors[e.target] if e.expert is None else tensors[e.target][e.expert]
                        value = _read(f, e, scales, packed)
                        dest.copy_(value.view(dest.dtype) if value.dtype in (torch.int8, torch.uint8) else value)
                    bar.update()
                    done += 1
                    if on_progress is not None:
                        on_progress(done, len(entries))
    model.load_state_dict(tensors, assign=True, strict=True)
    if packed:
        converter = ExpertConverter(expert_cache_bytes, dtype)
        for i, block in enumerate(model.layers):
            block.ffn.experts.converter, block.ffn.experts.layer = converter, i
        converter.counters.packed_bytes = sum(b.ffn.experts.packed_bytes() for b in model.layers)
        model.expert_converter = converter
    return model.eval()
