"""``dayzero quantize``: write an FP4-expert / FP8-dense checkpoint from a float one.

Output follows DeepSeek-V4's published format: expert weights int8-packed E2M1 with uint8
UE8M0 scales ``<name>.scale`` [out, in/32]; dense projections float8_e4m3fn with block
scales ``<name>.scale`` (UE8M0); the compressor / indexer-compressor projections, the router,
norms, embeddings and the head stay in their float dtype (as in the published checkpoints).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from ..checkpoint import CheckpointError, canonical_name
from .formats import fp8_block, quant_fp8, quant_mxfp4

EXPERT = re.compile(r"^layers\.\d+\.ffn\.experts\.\d+\.w[123]\.weight$")
DENSE = re.compile(
    r"^layers\.\d+\.(attn\.(wq_a|wq_b|wkv|wo_a|wo_b|indexer\.wq_b)|ffn\.shared_experts\.w[123])\.weight$"
)
BLOCK = 128


def quantization_config(experts: bool, dense: bool) -> dict:
    return {
        "quant_method": "fp8",
        "scale_fmt": "ue8m0",
        "weight_block_size": [BLOCK, BLOCK],
        "expert_dtype": "fp4" if experts else "fp8",
        "dense_dtype": "fp8" if dense else "bf16",
    }


def quantize_checkpoint(
    src: str | Path, dst: str | Path, experts: bool = True, dense: bool = True, progress: bool = True
) -> Path:
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    out: dict[str, torch.Tensor] = {}
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors files in {src}")
    handles = [safe_open(str(file), framework="pt") for file in files]
    keys = [(f, key) for f in handles for key in f.keys()]  # noqa: SIM118 - safe_open is not a mapping
    for f, key in tqdm(keys, desc="quantizing", unit="t", disable=not progress, leave=False):
        tensor, name = f.get_tensor(key), canonical_name(key)  # every tensor, vision tower included
        base = name.removesuffix(".weight")
        if experts and EXPERT.match(name):
            out[name], out[f"{base}.scale"] = quant_mxfp4(tensor)
        elif dense and DENSE.match(name) and (tile := fp8_block(*tensor.shape, BLOCK)):
            out[name], out[f"{base}.scale"] = quant_fp8(tensor, tile, ue8m0=True)
        else:
            out[name] = tensor.contiguous()
    save_file(out, str(dst / "model.safetensors"))
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = quantization_config(experts, dense)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    for extra in ("tokenizer.json", "generation_config.json", "tokenizer_config.json"):
        if (src / extra).exists():
            shutil.copy(src / extra, dst / extra)
    return dst
