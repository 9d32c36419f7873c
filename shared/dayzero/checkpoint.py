"""Load a DeepSeek-V4 checkpoint directory (config.json + safetensors) into dayzero's modules.

Two namings are accepted: DeepSeek's published one (``embed.weight``,
``layers.N.attn.wq_a.weight``, ``hc_head_fn``, ``head.weight``, ``mtp.0.*``) and the one
transformers writes on save (``model.`` prefix, ``model.embed_tokens.weight``, ``model.hc_head.hc_fn``).
Formats as released (dayzero.quant.formats, dayzero.quant.spec): FP8 dense weights with
128x128 block scales, dequantized at load; FP4 experts kept packed; FP8 experts dequantized;
scales float8_e8m0fnu or uint8 (reinterpreted bit for bit, never converted by value) or
float32; BF16/F32 tensors without scales as they are. ``mtp.N.*`` load into ``model.mtp``.

Headers are read first (memory-mapped, no data); a missing tensor, one whose shape or dtype
does not fit, one stored twice, or block scales that do not fit their FP8 weight
(dayzero.checkpoint_checks) fail the load with one error naming it, what was expected and what
was found, before any data is read; so does an E8M0 NaN (0xFF) among any expert's scales, and a
NaN or inf in any float tensor (FP8 ones decoded), as they are read. Tensors the model does not
use are listed in one log line.
Data is read tensor by tensor from memory-mapped shards, never a whole shard: host memory
peaks at the model's own bytes plus the shard being read (memory-mapped) and one tensor being
dequantized: bench/load.py measured 1.26x the loaded model's bytes above the process's baseline
(a 4-shard FP4/FP8 checkpoint, 117.5 MiB loaded, median of 3).
After loading, a sample of every quantized tensor is decoded (dayzero.quant.verify).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from .checkpoint_checks import check_headers
from .checkpoint_files import (
    CheckpointError,
    Entry,
    Placed,
    checkpoint_directory,
    mtp_layers,
    place,
    scan,
    unused_patterns,
)
from .config import ModelConfig
from .model.weights import Transformer, held_dtype, pin_attributes, skeleton
from .parallel import Group, ParallelConfig, check_divisible
from .parallel.shard import check_blocks, local_index, owns_expert, shard_skeleton, split_dim
from .quant.experts import ExpertConverter
from .quant.formats import MX_BLOCK, FormatError, dequant_fp8, ue8m0_bytes
from .quant.spec import QuantConfigError, QuantSpec, quant_spec
from .quant.verify import WeightCheckError, check_weights

__all__ = ["CheckpointError", "Headers", "check_split", "load_model", "packed_experts", "read_headers", "scan"]

log = logging.getLogger("dayzero.checkpoint")


def packed_experts(cfg: ModelConfig) -> bool:
    """Whether the checkpoint's experts are MXFP4 (kept packed); refuses formats dayzero cannot read,
    and FP4 experts whose input sizes are not whole 32-value blocks (one E8M0 scale each)."""
    packed = _spec(cfg).packed_experts
    for field, n in (("hidden_size", cfg.hidden_size), ("moe_intermediate_size", cfg.moe_intermediate_size)):
        if packed and n % MX_BLOCK:
            raise CheckpointError(f"FP4 experts need {field} divisible by {MX_BLOCK}; config.json has {n}")
    return packed


def _spec(cfg: ModelConfig) -> QuantSpec:
    try:
        return quant_spec(cfg.raw)
    except QuantConfigError as exc:
        raise CheckpointError(str(exc)) from exc


def _decode(f, e: Entry, p: Placed, scales: dict, block: tuple[int, int], index: tuple) -> torch.Tensor:
    """This rank's part (``index``) of one tensor as the model holds it: MX scales as E8M0 bytes,
    FP8 dequantized with its block scales (sliced alike)."""
    tensor = _part(f, e.key, index)
    try:
        if p.role == "mx_scale":
            exponents = ue8m0_bytes(tensor, e.key)
            if (exponents == 255).any():  # every expert's: the weight check samples only a few
                raise FormatError(f"{e.key}: a scale is 0xFF (NaN in E8M0)")
            return exponents
        if tensor.dtype == torch.float8_e4m3fn:
            value = dequant_fp8(tensor, scales[(p.target, p.expert)], e.key, block)
            if not _finite(value):
                raise FormatError(f"{e.key}: FP8 weight decodes to non-finite values")
            return value
    except FormatError as exc:
        raise CheckpointError(str(exc)) from exc
    if tensor.is_floating_point() and not _finite(tensor):  # norms, HC scales, embeddings, ...
        raise CheckpointError(f"{e.key}: non-finite values (NaN or inf)")
    return tensor


def _finite(tensor: torch.Tensor, chunk: int = 1 << 20) -> bool:
    """No NaN or inf in ``tensor``, checked a million values at a time: torch.isfinite's temporaries
    are the size of its whole input (bench/load.py: peak 1.25x -> 1.33x the model's bytes, chunked
    1.27x). ~0.7 GiB/s on one core: V4-Flash's bf16 embedding and head add ~3 s to a load."""
    return all(torch.isfinite(part).all() for part in tensor.reshape(-1).split(chunk))


def _part(f, key: str, index: tuple) -> torch.Tensor:
    """The stored tensor ``key``, or only its ``index`` part: nothing else is read."""
    return f.get_slice(key)[index] if index else f.get_tensor(key)


def _index(e: Entry, p: Placed, parallel: ParallelConfig, block: tuple[int, int]) -> tuple:
    """Which part of a stored tensor this rank reads: whole experts (its own), slices of the rest."""
    if p.expert is not None:
        return ()
    if p.role != "block_scale":
        return local_index(p.target, e.shape, parallel)
    dim = split_dim(p.target)
    return local_index(p.target, e.shape, parallel, block[dim] if dim is not None else 1)


@dataclass(frozen=True, slots=True)
class Headers:
    """A checkpoint's stored tensors (headers only), checked against the model its config describes."""

    model: Transformer  # the whole module tree, meta device
    entries: list[Entry]  # every stored tensor but the vision tower's
    used: list[tuple[Entry, Placed]]  # the ones the model loads, and what each fills
    unused: list[Entry]  # the ones it ignores
    mtp_layers: int  # the ``mtp.N`` layers shipped


def read_headers(root: Path, cfg: ModelConfig) -> Headers:
    """Every tensor's header against ``cfg``'s model: names, shapes, dtypes, scales. A checkpoint that
    cannot load fails here, in one CheckpointError naming a tensor, before any data is read."""
    entries = list(scan(root))
    packed, n_mtp = packed_experts(cfg), mtp_layers(entries)
    model = skeleton(cfg, packed, n_mtp)
    expected = model.state_dict()
    placed = [(e, place(e.name, packed)) for e in entries]
    used = [(e, p) for e, p in placed if p.target in expected]
    try:
        check_headers(used, expected, _spec(cfg).block)
    except CheckpointError as exc:
        if absent := cfg.defaulted_sizes():
            lacks = ", ".join(absent)
            raise CheckpointError(f"{exc}; config.json lacks {lacks} (transformers' default taken)") from None
        raise
    return Headers(model, entries, used, [e for e, p in placed if p.target not in expected], n_mtp)


def check_split(root: Path, world_sizes: Iterable[int], cfg: ModelConfig | None = None) -> Headers:
    """What loading on each of ``world_sizes`` ranks would refuse, from one read of the headers
    (no data): the tensors against the config, and the sizes the ranks split (whole FP8 blocks each)."""
    cfg = cfg or ModelConfig.from_file(root)
    return _checked(root, cfg, _spec(cfg), [ParallelConfig(n) for n in sorted(set(world_sizes))])


def _checked(root: Path, cfg: ModelConfig, spec: QuantSpec, splits: list[ParallelConfig]) -> Headers:
    for parallel in splits:
        check_divisible(cfg, parallel.world_size)
    headers = read_headers(root, cfg)
    if cfg.num_nextn_predict_layers > headers.mtp_layers:
        declared, shipped = cfg.num_nextn_predict_layers, headers.mtp_layers
        log.info("config declares %d MTP layer(s), the checkpoint ships %d", declared, shipped)
    if headers.unused:
        unused = [e.name for e in headers.unused]
        log.warning("ignoring %d tensor(s) the model does not use: %s", len(unused), unused_patterns(unused))
    for e, p in headers.used:
        if e.dtype_name == "float8_e4m3fn" and p.expert is None:
            for parallel in splits:
                check_blocks(e.key, e.shape, parallel, spec.block)
    return headers


def _layout(
    root: Path, cfg: ModelConfig, spec: QuantSpec, parallel: ParallelConfig
) -> tuple[Transformer, list[tuple[Entry, Placed]]]:
    """The rank's module tree (local shapes, meta device) and the entries it reads, all checked."""
    headers = _checked(root, cfg, spec, [parallel])
    shard_skeleton(headers.model, parallel)
    owned = lambda p: p.expert is None or owns_expert(parallel, cfg.n_routed_experts, p.expert)
    return headers.model, [(e, p) for e, p in headers.used if owned(p)]


def load_model(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    progress: bool = True,
    expert_cache_bytes: int = 0,
    on_progress: Callable[[int, int], None] | None = None,
    group: Group | None = None,
) -> Transformer:
    """Checkpoint directory -> ready ``Transformer`` (fp32 kept for norms, HC, sinks, biases).

    FP8 weights are dequantized to ``dtype`` at load; FP4 experts stay packed and are
    converted per call (``expert_cache_bytes`` of hot experts kept dequantized).
    ``progress``: a progress bar on stderr; ``on_progress(done, total)`` after each tensor.
    ``group``: the ranks the model is split over (dayzero.parallel); this rank reads only its
    own slices and experts. The weight check's result is ``model.weight_check``; a failing
    check raises CheckpointError.
    """
    root = checkpoint_directory(path)
    group = group or Group()
    cfg = ModelConfig.from_file(root)
    spec = _spec(cfg)
    model, placed = _layout(root, cfg, spec, group.config)
    layout = model.state_dict()

    tensors = {
        name: torch.empty(t.shape, dtype=held_dtype(name, t.dtype, dtype), device=device) for name, t in layout.items()
    }
    fp8 = _read(placed, tensors, spec, group.config, progress, on_progress)
    model.load_state_dict(tensors, assign=True, strict=True)
    _check_hash_tables(model, cfg.n_routed_experts)
    model.comm = group
    try:
        model.weight_check = check_weights(model, fp8)
    except WeightCheckError as exc:
        raise CheckpointError(f"weight check failed: {exc}") from exc
    if spec.packed_experts:
        _install_converter(model, expert_cache_bytes, dtype)
    pin_attributes(model)
    return model.eval()


def _check_hash_tables(model: Transformer, experts: int) -> None:
    """Hash layers route token t to ``tid2eid[t]``: an expert id outside [0, experts) is named here,
    not an index error in the first forward."""
    for name, table in model.named_buffers():
        outside = (table < 0) | (table >= experts) if name.endswith("tid2eid") else None
        if outside is not None and outside.any():
            raise CheckpointError(f"tensor {name!r} routes to expert {int(table[outside][0])}, outside [0, {experts})")


def _read(
    placed: list[tuple[Entry, Placed]],
    tensors: dict[str, torch.Tensor],
    spec: QuantSpec,
    parallel: ParallelConfig,
    progress: bool,
    on_progress: Callable[[int, int], None] | None,
) -> int:
    """Fill ``tensors`` with this rank's parts, shard by shard; -> how many FP8 weights were decoded."""
    by_file: dict[Path, list[tuple[Entry, Placed]]] = {}
    for e, p in placed:
        by_file.setdefault(e.file, []).append((e, p))
    scales = _block_scales(by_file, spec, parallel)
    done, fp8 = 0, 0
    with tqdm(total=len(placed), desc="loading tensors", unit="t", disable=not progress, leave=False) as bar:
        for file, items in by_file.items():
            with safe_open(str(file), framework="pt") as f:
                for e, p in items:
                    if p.role != "block_scale":
                        dest = tensors[p.target]
                        if p.expert is not None:  # this rank's experts start at rank * its count
                            dest = dest[p.expert - parallel.rank * dest.shape[0]]
                        value = _decode(f, e, p, scales, spec.block, _index(e, p, parallel, spec.block))
                        fp8 += e.dtype_name == "float8_e4m3fn"
                        dest.copy_(value.view(dest.dtype) if value.dtype in (torch.int8, torch.uint8) else value)
                    bar.update()
                    done += 1
                    if on_progress is not None:
                        on_progress(done, len(placed))
    return fp8


def _block_scales(
    by_file: dict[Path, list[tuple[Entry, Placed]]], spec: QuantSpec, parallel: ParallelConfig
) -> dict[tuple[str, int | None], torch.Tensor]:
    """Every FP8 weight's block scales (this rank's rows or columns of the grid), keyed like ``Placed``."""
    scales: dict[tuple[str, int | None], torch.Tensor] = {}
    for file, items in by_file.items():
        with safe_open(str(file), framework="pt") as f:
            for e, p in items:
                if p.role == "block_scale":
                    scales[(p.target, p.expert)] = _part(f, e.key, _index(e, p, parallel, spec.block))
    return scales


def _install_converter(model: Transformer, cache_bytes: int, dtype: torch.dtype) -> None:
    converter = ExpertConverter(cache_bytes, dtype)
    blocks = [*model.layers, *model.mtp]
    for i, block in enumerate(blocks):
        block.ffn.experts.converter, block.ffn.experts.layer = converter, i
    converter.counters.packed_bytes = sum(b.ffn.experts.packed_bytes() for b in blocks)
    model.expert_converter = converter
