"""The built-in tiny checkpoint: random weights in DeepSeek-V4's published format.

Built with transformers' ``DeepseekV4ForCausalLM`` (the reference), with every
parameter the reference initialises to zero (sinks, position biases, mixing biases,
routing bias, hash table) drawn at random so that each of them matters, then saved
under DeepSeek's own tensor names. Exercises sliding, CSA and HCA layers, hash and
top-k MoE, and hc_mult = 4.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from .chat.tokens import BOS, EOS, IMAGE, SPECIAL_TOKENS
from .checkpoint_files import canonical_name
from .quant.shards import built_beside, save_tensors, write_shards

DEMO_VISION: dict[str, Any] = {
    "depth": 4,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "out_hidden_size": 64,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 56,
    "fullatt_block_indexes": [1, 3],
}

DEMO_CONFIG: dict[str, Any] = {
    "model_type": "deepseek_v4",
    "vocab_size": 512,
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "head_dim": 32,
    "partial_rotary_factor": 0.5,
    "q_lora_rank": 32,
    "o_groups": 2,
    "o_lora_rank": 16,
    "sliding_window": 16,
    "layer_types": [
        "sliding_attention",
        "compressed_sparse_attention",
        "heavily_compressed_attention",
        "compressed_sparse_attention",
    ],
    "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
    "index_n_heads": 16,
    "index_head_dim": 16,
    "index_topk": 4,
    "hc_mult": 4,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"],
    "bos_token_id": 0,
    "eos_token_id": 1,
    "max_position_embeddings": 65536,
}

_CORPUS = (
    "The quick brown fox jumps over the lazy dog. dayzero serves sparse models on the day "
    "their weights come out: prefill, decode, compressed attention, experts in four bits. "
    "Hello world! Numbers 0 1 2 3 4 5 6 7 8 9 and punctuation, quotes 'like' \"these\"; "
)


def build_tokenizer(vocab_size: int, texts: list[str] | None = None) -> Tokenizer:
    """A byte-level BPE with V4's special tokens as ids 0, 1, ... (BOS prepended on encode), trained
    on ``texts`` (default: a built-in paragraph); deterministic, no downloads."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts or [_CORPUS] * 4, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, 0)])
    return tok


# DeepSeek-V3's tokenizer.json pre-tokenizers: digits in threes, CJK runs, then words and punctuation
DEEPSEEK_V3_SPLITS = (
    r"\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
)


def deepseek_v3_pre_tokenizer() -> pre_tokenizers.Sequence:
    """DeepSeek-V3's pre-tokenizer: each of ``DEEPSEEK_V3_SPLITS`` isolated, then ByteLevel's bytes (no regex)."""
    splits = [pre_tokenizers.Split(Regex(p), "isolated") for p in DEEPSEEK_V3_SPLITS]
    return pre_tokenizers.Sequence([*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def randomize_zero_inits(model: torch.nn.Module, seed: int) -> None:
    """Give the reference's zero-initialised parameters random values (in place)."""
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("sinks", "position_bias", ".base", "hc_base", "e_score_correction_bias")):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
        for name, buf in model.named_buffers():
            if name.endswith("tid2eid"):
                experts = model.config.n_routed_experts
                buf.copy_(torch.stack([torch.randperm(experts, generator=gen)[: buf.shape[1]] for _ in buf]))


def write_checkpoint(out: str | Path, raw_config: dict[str, Any], seed: int = 0) -> Path:
    """Random-weight checkpoint from a config dict, saved under DeepSeek's published names."""
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    fields = {k: v for k, v in raw_config.items() if k != "model_type"}
    reference = DeepseekV4ForCausalLM(DeepseekV4Config(**fields)).eval()
    randomize_zero_inits(reference, seed)
    with tempfile.TemporaryDirectory() as tmp:
        reference.save_pretrained(tmp)
        tensors = load_file(str(Path(tmp) / "model.safetensors"))
        (out / "config.json").write_text((Path(tmp) / "config.json").read_text())
    write_shards({canonical_name(k): v.contiguous() for k, v in tensors.items()}, out)  # and no stale shards
    return out


def add_vision(out: Path, vision: dict[str, Any], image_token_id: int, seed: int) -> None:
    """Add a random Qwen2.5-VL vision tower (``visual.*``) to a checkpoint written by ``write_checkpoint``."""
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    torch.manual_seed(seed + 7)
    tower = Qwen2_5_VisionTransformerPretrainedModel._from_config(Qwen2_5_VLVisionConfig(**vision)).eval()
    with torch.no_grad():
        for p in tower.parameters():
            p.normal_(0.0, 0.05)
    tensors = load_file(str(out / "model.safetensors"))
    tensors.update({f"visual.{k}": v.contiguous() for k, v in tower.state_dict().items()})
    save_tensors(tensors, out / "model.safetensors")
    config = json.loads((out / "config.json").read_text())
    config.update(vision_config={**Qwen2_5_VLVisionConfig(**vision).to_dict(), **vision}, image_token_id=image_token_id)
    (out / "config.json").write_text(json.dumps(config, indent=2))


def add_mtp(out: Path, seed: int) -> None:
    """Add one random MTP layer (``mtp.0.*`` in DeepSeek's MTPBlock layout: e_proj, h_proj, enorm,
    hnorm, norm, hc_head_*, a sliding-attention block with a score-routed MoE) and the release's
    ``num_nextn_predict_layers`` and ``compress_ratios`` (each layer's rate, the MTP layer's 0 last)."""
    from .config import ModelConfig
    from .model.weights import skeleton

    config = json.loads((out / "config.json").read_text())
    cfg = ModelConfig.from_dict(config)
    gen = torch.Generator().manual_seed(seed + 11)
    tensors = load_file(str(out / "model.safetensors"))
    for name, t in skeleton(cfg, mtp_layers=1).mtp.state_dict().items():
        value = torch.randn(t.shape, generator=gen) * (0.02 if t.dim() >= 2 else 0.5)
        if name.endswith("norm.weight"):
            value = 1 + 0.1 * torch.randn(t.shape, generator=gen)
        stem, _, matrix = name.rpartition(".")
        if stem.endswith("ffn.experts"):  # stacked [E, ...] in the model, one tensor per expert on disk
            tensors.update({f"mtp.{stem}.{e}.{matrix}.weight": value[e].contiguous() for e in range(t.shape[0])})
        else:
            tensors[f"mtp.{name}"] = value
    save_tensors(tensors, out / "model.safetensors")
    ratios = [cfg.compress_rate(i) for i in range(cfg.num_layers)] + [0]
    config.update(num_nextn_predict_layers=1, compress_ratios=ratios)
    (out / "config.json").write_text(json.dumps(config, indent=2))


def write_demo_checkpoint(
    out: str | Path, seed: int = 0, vision: bool = False, fp4: bool = False, shards: int = 1
) -> Path:
    """The built-in default checkpoint in the release's layout: weights (with an MTP layer), config,
    tokenizer (V4's special tokens; no chat template: like the release, it is prompted with
    DeepSeek-V4's own encoding) and generation config. ``vision``: plus a tiny vision tower and
    the ``<｜deepseek_image｜>`` placeholder; ``fp4``: the release's formats (FP4 experts, FP8 dense
    projections, float8_e8m0fnu scales); ``shards``: that many files with an index. Built beside
    ``out`` and moved in whole, replacing the weights it held: a build that fails (too many shards
    for its tensors) leaves ``out`` as it was."""
    out = Path(out)
    with built_beside(out) as built:
        _build_demo(built, seed, vision, fp4, shards)
    return out


def _build_demo(out: Path, seed: int, vision: bool, fp4: bool, shards: int) -> None:
    out = write_checkpoint(out, DEMO_CONFIG, seed)
    if vision:
        add_vision(out, DEMO_VISION, SPECIAL_TOKENS.index(IMAGE), seed)
    add_mtp(out, seed)
    if fp4:
        from .quant.quantize import quantize_checkpoint

        with tempfile.TemporaryDirectory() as tmp:
            quantize_checkpoint(out, tmp, progress=False, shards=shards)
            (out / "model.safetensors").unlink()
            for file in [*Path(tmp).glob("model*.safetensors*"), Path(tmp) / "config.json"]:
                shutil.move(str(file), str(out / file.name))
    elif shards > 1:
        write_shards(load_file(str(out / "model.safetensors")), out, shards)
    write_tokenizer(out, build_tokenizer(DEMO_CONFIG["vocab_size"]))


def write_tokenizer(out: Path, tok: Tokenizer) -> None:
    """``tokenizer.json``, ``tokenizer_config.json`` (BOS / EOS, no chat template) and the generation config."""
    tok.save(str(out / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False))
    generation = {"bos_token_id": 0, "eos_token_id": 1, "do_sample": False, "max_new_tokens": 64}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))


def ensure_demo_checkpoint(path: Path) -> Path:
    """A random demo checkpoint written once at ``path`` (safe when several processes race): the
    fallback when the package ships no trained model (Settings.checkpoint_dir)."""
    if (path / "model.safetensors").exists():
        return path
    print(f"creating the built-in demo checkpoint in {path}", file=sys.stderr)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=".demo-"))
    write_demo_checkpoint(tmp, vision=True, fp4=True)
    try:
        tmp.rename(path)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return path
