"""The trained model in DeepSeek-V4's published layout, and back into the transformers reference.

``export``: main tensors under DeepSeek's names (transformers' own reverse weight conversion),
the MTP layer as ``mtp.0.*`` (its decoder layer converted as if it were layer num_layers, then
renamed), a random Qwen2.5-VL tower so the stack's vision stage starts, then the release's
formats (``dayzero.quant.quantize``: FP4 experts, FP8 dense, float8_e8m0fnu scales).

``load_reference``: the exported directory back into a ``DemoModel`` — the main model through
transformers' own FP8/FP4 loader, the MTP block the same way from a copy of the checkpoint whose
``mtp.0`` block is presented as one more layer, ``e_proj`` / ``h_proj`` dequantized by
``dayzero.quant.formats``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from transformers.core_model_loading import revert_weight_conversion

from ..chat.tokens import IMAGE, SPECIAL_TOKENS
from ..checkpoint_files import canonical_name
from ..demo import DEMO_VISION, add_vision, write_tokenizer
from ..quant.formats import dequant_fp8
from ..quant.quantize import quantize_checkpoint
from ..quant.shards import save_tensors
from .model import MTP, DemoModel, mtp_config

MTP_OWN = ("e_proj.weight", "h_proj.weight", "enorm.weight", "hnorm.weight", "norm.weight")
HC_HEAD = {"hc_head.hc_fn": "hc_head_fn", "hc_head.hc_base": "hc_head_base", "hc_head.hc_scale": "hc_head_scale"}


def release_tensors(model: DemoModel) -> dict[str, torch.Tensor]:
    """Every trained tensor under DeepSeek's published names (floats fp32, experts one tensor each)."""
    lm, n = model.lm, model.lm.config.num_hidden_layers
    named = {canonical_name(k): v for k, v in revert_weight_conversion(lm, lm.state_dict()).items()}
    block = {f"model.layers.{n}.{k}": v for k, v in model.mtp.block.state_dict().items()}
    for key, value in revert_weight_conversion(lm, block).items():
        named[canonical_name(key).replace(f"layers.{n}.", "mtp.0.", 1)] = value
    own = model.mtp.state_dict()
    named.update({f"mtp.0.{k}": own[k] for k in MTP_OWN})
    named.update({f"mtp.0.{v}": own[k] for k, v in HC_HEAD.items()})
    return {k: (v.float() if v.is_floating_point() else v).detach().contiguous() for k, v in named.items()}


def _config(model: DemoModel) -> dict:
    """config.json as transformers writes it, plus the release's MTP fields (one layer, rate 0 last)."""
    config = model.lm.config
    raw = json.loads(config.to_json_string(use_diff=False))
    rates = [config.compress_rates.get(kind, 0) for kind in config.layer_types]
    raw.update(num_nextn_predict_layers=1, compress_ratios=[*rates, 0])
    return raw


def write_float(model: DemoModel, tok: Tokenizer, out: Path, seed: int = 0) -> Path:
    """The checkpoint before the release's formats: fp32 tensors under the published names, config,
    tokenizer and a random vision tower (the stack's vision stage needs one)."""
    out.mkdir(parents=True, exist_ok=True)
    save_tensors(release_tensors(model), out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(_config(model), indent=2))
    hidden = model.lm.config.hidden_size
    add_vision(out, {**DEMO_VISION, "out_hidden_size": hidden}, SPECIAL_TOKENS.index(IMAGE), seed)
    write_tokenizer(out, tok)
    return out


def export(model: DemoModel, tok: Tokenizer, out: Path, float_out: Path | None = None, seed: int = 0) -> Path:
    """Write the release-layout checkpoint (FP4 experts, FP8 dense, E8M0 scales) to ``out``;
    ``float_out``: keep the float checkpoint it was quantized from there."""
    with tempfile.TemporaryDirectory() as tmp:
        quantize_checkpoint(write_float(model, tok, float_out or Path(tmp), seed), out, progress=False)
    return out


def _as_layer(tensors: dict[str, torch.Tensor], n: int) -> dict[str, torch.Tensor]:
    """The checkpoint with its ``mtp.0`` decoder block renamed to ``layers.{n}`` (own parts dropped)."""
    own = {f"mtp.0.{k}" for k in (*MTP_OWN, *HC_HEAD.values())} | {f"mtp.0.{k[:-7]}.scale" for k in MTP_OWN}
    out = {k: v for k, v in tensors.items() if not k.startswith(("mtp.", "visual."))}
    out.update({f"layers.{n}.{k[6:]}": v for k, v in tensors.items() if k.startswith("mtp.0.") and k not in own})
    return out


def _mtp_block(path: Path, config) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """transformers' decoder layer for ``mtp.0``, loaded (and dequantized) by transformers itself."""
    from ..align import reference_model

    n, raw, extended = config.num_hidden_layers, json.loads((path / "config.json").read_text()), mtp_config(config)
    raw.update(num_hidden_layers=n + 1, layer_types=extended.layer_types, mlp_layer_types=extended.mlp_layer_types)
    raw.pop("compress_ratios", None)
    with tempfile.TemporaryDirectory() as tmp:
        tensors = load_file(str(path / "model.safetensors"))
        save_file(_as_layer(tensors, n), str(Path(tmp) / "model.safetensors"))
        (Path(tmp) / "config.json").write_text(json.dumps(raw))
        return reference_model(Path(tmp)).model.layers[n], tensors


def _dequantized(tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    scale = tensors.get(f"{name.removesuffix('.weight')}.scale")
    return tensors[name].float() if scale is None else dequant_fp8(tensors[name], scale, name)


def load_reference(path: Path) -> DemoModel:
    """An exported checkpoint (one safetensors file) -> ``DemoModel`` in fp32, for evaluation."""
    from ..align import reference_model

    lm = reference_model(path)
    block, tensors = _mtp_block(path, lm.config)
    mtp = MTP(lm.config)
    state = {k: _dequantized(tensors, f"mtp.0.{k}") for k in MTP_OWN}
    state.update({k: tensors[f"mtp.0.{v}"] for k, v in HC_HEAD.items()})
    state.update({f"block.{k}": v for k, v in block.state_dict().items()})
    mtp.load_state_dict(state, strict=True)
    return DemoModel(lm, mtp.float().eval()).eval()
