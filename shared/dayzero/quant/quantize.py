"""``dayzero quantize``: write a checkpoint in DeepSeek-V4's published format from a float one.

Output as released: expert weights int8-packed E2M1 with float8_e8m0fnu scales ``<name>.scale``
[out, in/32] (``--experts fp4``); dense projections (attention, shared experts, MTP's e_proj /
h_proj) float8_e4m3fn with float8_e8m0fnu 128x128 block scales ``<name>.scale`` (``--dense fp8``);
the compressor / indexer-compressor projections, the router, norms, embeddings and the head stay
in their float dtype, as in the releases. The quantization_config is the releases' own, so
the result loads in dayzero and in transformers. Shards with an index when ``shards`` > 1.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from ..checkpoint_files import CheckpointError, canonical_name, scan, weight_files
from ..config import ModelConfig
from .formats import FP8_BLOCK, fp8_aligned, quant_fp8, quant_mxfp4
from .shards import built_beside, check_shards, write_shards

EXPERT = re.compile(r"^(layers|mtp)\.\d+\.ffn\.experts\.\d+\.w[123]\.weight$")
DENSE = re.compile(
    r"^(layers|mtp)\.\d+\.(attn\.(wq_a|wq_b|wkv|wo_a|wo_b|indexer\.wq_b)|ffn\.shared_experts\.w[123]"
    r"|e_proj|h_proj)\.weight$"
)
QUANTIZED_DTYPES = {"float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "int8"}  # int8: packed FP4 pairs
COMPANIONS = (
    "tokenizer.json",
    "generation_config.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "encoding/encoding_dsv4.py",  # DeepSeek's encoder: the tokenizer reads its reasoning-effort table
)


def quantization_config(experts: str) -> dict:
    """The releases' quantization_config (``experts``: fp4 or fp8)."""
    return {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "scale_fmt": "ue8m0",
        "weight_block_size": list(FP8_BLOCK),
        "expert_dtype": experts,
    }


def _quantized(name: str, tensor: torch.Tensor, experts: str) -> dict[str, torch.Tensor]:
    """One tensor as the release stores it (the weight and, when quantized, its ``.scale``)."""
    base = name.removesuffix(".weight")
    if EXPERT.match(name) and experts == "fp4":
        packed, scales = quant_mxfp4(tensor)
        return {name: packed, f"{base}.scale": scales.view(torch.float8_e8m0fnu)}
    if (DENSE.match(name) or (EXPERT.match(name) and experts == "fp8")) and fp8_aligned(*tensor.shape):
        weight, scales = quant_fp8(tensor, ue8m0=True)
        return {name: weight, f"{base}.scale": scales.view(torch.float8_e8m0fnu)}
    return {name: tensor.contiguous()}


def check_apart(src: Path, dst: Path, names: tuple[str, str] = ("the input", "the output")) -> None:
    """Writing ``dst`` leaves ``src`` as it was: neither is the other, nor inside it (``names``:
    what the user calls them)."""
    src, dst = src.resolve(), dst.resolve()
    if src == dst or src in dst.parents or dst in src.parents:
        raise ValueError(f"{names[1]} {dst} must not be {names[0]} {src}, inside it or around it")


def _float_config(src: Path) -> dict:
    """``src``'s config.json, checked with its headers (an unreadable shard ends here): a float checkpoint."""
    raw = ModelConfig.from_file(src).raw
    quantized = sorted({e.dtype_name for e in scan(src)} & QUANTIZED_DTYPES)
    if quantized or raw.get("quantization_config"):
        why = f"its tensors hold {', '.join(quantized)}" if quantized else "its config.json has a quantization_config"
        raise CheckpointError(f"{src} is already quantized ({why}): quantize takes a float checkpoint")
    return raw


def quantize_checkpoint(
    src: str | Path, dst: str | Path, experts: str = "fp4", progress: bool = True, shards: int = 1
) -> Path:
    """FP8 dense weights always (the releases' format); experts ``fp4`` (the Instruct releases) or
    ``fp8`` (the Base releases). Reads one tensor at a time. Everything is checked before ``dst``
    is written: ``experts``, ``shards``, that ``src`` is a readable float checkpoint apart from ``dst``."""
    if experts not in ("fp4", "fp8"):
        raise ValueError(f"experts must be fp4 or fp8, got {experts!r}")
    src, dst = Path(src), Path(dst)
    check_apart(src, dst)
    config = _float_config(src)
    handles = [safe_open(str(file), framework="pt") for file in weight_files(src)]
    keys = [(f, key) for f in handles for key in f.keys()]  # noqa: SIM118 - safe_open is not a mapping
    check_shards(shards, len(keys))
    with built_beside(dst) as built:
        out: dict[str, torch.Tensor] = {}
        for f, key in tqdm(keys, desc="quantizing", unit="t", disable=not progress, leave=False):
            out.update(_quantized(canonical_name(key), f.get_tensor(key), experts))  # vision tower included
        write_shards(out, built, shards)
        config["quantization_config"] = quantization_config(experts)
        (built / "config.json").write_text(json.dumps(config, indent=2))
        for extra in COMPANIONS:
            if (src / extra).exists():
                (built / extra).parent.mkdir(exist_ok=True)
                shutil.copyfile(src / extra, built / extra)  # the umask's mode, as the weights (not the source's)
    return dst
