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

from ..checkpoint_files import CheckpointError, canonical_name
from .formats import FP8_BLOCK, fp8_aligned, quant_fp8, quant_mxfp4
from .shards import write_shards

EXPERT = re.compile(r"^(layers|mtp)\.\d+\.ffn\.experts\.\d+\.w[123]\.weight$")
DENSE = re.compile(
    r"^(layers|mtp)\.\d+\.(attn\.(wq_a|wq_b|wkv|wo_a|wo_b|indexer\.wq_b)|ffn\.shared_experts\.w[123]"
    r"|e_proj|h_proj)\.weight$"
)
COMPANIONS = ("tokenizer.json", "generation_config.json", "tokenizer_config.json", "chat_template.jinja")


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


def quantize_checkpoint(
    src: str | Path, dst: str | Path, experts: str = "fp4", progress: bool = True, shards: int = 1
) -> Path:
    """FP8 dense weights always (the releases' format); experts ``fp4`` (the Instruct releases) or
    ``fp8`` (the Base releases). Reads one tensor at a time."""
    if experts not in ("fp4", "fp8"):
        raise ValueError(f"experts must be fp4 or fp8, got {experts!r}")
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors files in {src}")
    out: dict[str, torch.Tensor] = {}
    handles = [safe_open(str(file), framework="pt") for file in files]
    keys = [(f, key) for f in handles for key in f.keys()]  # noqa: SIM118 - safe_open is not a mapping
    for f, key in tqdm(keys, desc="quantizing", unit="t", disable=not progress, leave=False):
        out.update(_quantized(canonical_name(key), f.get_tensor(key), experts))  # vision tower included
    write_shards(out, dst, shards)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = quantization_config(experts)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    for extra in COMPANIONS:
        if (src / extra).exists():
            shutil.copy(src / extra, dst / extra)
    return dst
