"""``dayzero inspect``: parameter counts, tensor dtypes and a memory plan, from headers and config only.

Counting convention (as transformers counts ``DeepseekV4ForCausalLM`` parameters): every
learned weight, embeddings and the output head included; the routing correction bias and
the hash-routing table are buffers, not parameters; the MTP layer is not instantiated.
Active parameters per token: everything except the routed experts, plus the
``num_experts_per_tok`` routed experts each MoE layer uses.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from ..checkpoint import packed_experts, scan
from ..checkpoint_files import mtp_layers, place
from ..config import ModelConfig
from ..kv.layout import GROWING_POOLS, PoolLayout
from ..model.weights import skeleton

GIB = 1 << 30
H200_BYTES = 141e9  # one H200's HBM, as sold (about 131 GiB)


def _pro_ratios(n: int = 61) -> list[int]:
    return [128, 128] + [4 if i % 2 == 0 else 128 for i in range(n - 2)] + [0]


# The released configs by name. Flash is transformers' DeepseekV4Config defaults (284.33B, as
# published). Pro: the fields known (hidden 7168, 61 layers, 128 heads, 384 experts of 3072,
# index_topk 1024, compress_ratios [128, 128, 4, 128, ...]); the rest are Flash's, so its counts
# (1.57T total, 43.8B active) come out within 3% of the published 1.6T but not exactly.
PRESETS: dict[str, dict] = {
    "deepseek-v4-flash": {"model_type": "deepseek_v4", "num_nextn_predict_layers": 1},
    "deepseek-v4-pro": {
        "model_type": "deepseek_v4",
        "hidden_size": 7168,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "n_routed_experts": 384,
        "moe_intermediate_size": 3072,
        "index_topk": 1024,
        "compress_ratios": _pro_ratios(),
        "num_nextn_predict_layers": 1,
    },
}


@dataclass(frozen=True, slots=True)
class Report:
    total_params: int
    active_params: int
    active_params_without_embedding: int  # the embedding table is a lookup: one row per token
    routed_expert_params: int
    tensors_by_dtype: dict[str, int]
    unmapped_tensors: list[str]
    memory_gib: dict[str, float]  # per device
    plan: dict[str, float | int | str]

    def to_dict(self) -> dict:
        return asdict(self)


def count_params(cfg: ModelConfig) -> tuple[int, int, int]:
    """(total, active per token, routed experts) parameter counts."""
    shapes = skeleton(cfg).state_dict()
    total = routed = 0
    for name, t in shapes.items():
        if name.endswith(("tid2eid", "gate.bias")):
            continue
        total += t.numel()
        if ".ffn.experts." in name:
            routed += t.numel()
    active = total - routed + routed * cfg.num_experts_per_tok // cfg.n_routed_experts
    return total, active, routed


def memory_plan(
    cfg: ModelConfig,
    total: int,
    routed: int,
    batch: int,
    context: int,
    devices: int,
    expert_cache_gib: float,
    fp4: bool,
) -> dict[str, float]:
    """GiB per device by region (bf16 serving; experts FP4 when ``fp4``; experts split over devices)."""
    experts_bytes = routed * (0.5 + 1 / 32) if fp4 else routed * 2
    dense_bytes = (total - routed) * 2
    one_expert = 3 * cfg.moe_intermediate_size * cfg.hidden_size * 2
    workspace = min(cfg.n_routed_experts, batch * cfg.num_experts_per_tok) * one_expert if fp4 else 0
    layout = PoolLayout.of(cfg, 64, "bfloat16")
    per_token = sum(layout.row_bytes(p, 2) / layout.rate(p) for p in GROWING_POOLS)
    window = layout.window_capacity * layout.row_bytes("window", 2) + layout.row_bytes("compressor", 4)
    pools = batch * (context * per_token + window)
    hyper = batch * cfg.hc_mult * cfg.hidden_size * 4 * 2  # residual streams + mixed copy, fp32
    activations = 2048 * cfg.hidden_size * 2 * 8  # one prefill chunk, a few live [T, hidden] buffers
    return {
        "packed_weights": (experts_bytes / devices + dense_bytes) / GIB,
        "dequant_workspace": workspace / GIB,
        "expert_cache": expert_cache_gib if fp4 else 0.0,
        "attention_pools": pools / devices / GIB,
        "hyper_connection_state": hyper / GIB,
        "activations": activations / GIB,
    }


def _total(cfg: ModelConfig, total: int, routed: int, batch: int, context: int, devices: int, cache: float, fp4: bool):
    """Bytes one device holds when the experts and sequences are spread over ``devices``."""
    return sum(memory_plan(cfg, total, routed, batch, context, devices, cache, fp4).values()) * GIB


def inspect(
    path: str | Path, batch: int = 1, context: int = 65536, devices: int = 1, expert_cache_gib: float = 0.0
) -> Report:
    cfg = ModelConfig.from_dict(PRESETS[str(path)]) if str(path) in PRESETS else ModelConfig.from_file(path)
    path = Path(path)
    total, active, routed = count_params(cfg)
    dtypes: Counter[str] = Counter()
    unmapped: list[str] = []
    if path.is_dir() and (any(path.glob("*.safetensors")) or (path / "model.safetensors.index.json").exists()):
        entries = list(scan(path))
        packed = packed_experts(cfg)
        expected = skeleton(cfg, packed, mtp_layers(entries)).state_dict()
        for entry in entries:
            dtypes[entry.dtype_name] += 1
            if place(entry.name, packed).target not in expected:
                unmapped.append(entry.key)
    fp4 = packed_experts(cfg) if dtypes else True  # a bare config: plan for the published FP4 experts
    memory = memory_plan(cfg, total, routed, batch, context, devices, expert_cache_gib, fp4)
    needed = next(
        (
            n
            for n in range(1, 257)
            if _total(cfg, total, routed, batch, context, n, expert_cache_gib, fp4) <= H200_BYTES
        ),
        None,
    )
    plan = {
        "batch": batch,
        "context": context,
        "devices": devices,
        "experts": "fp4" if fp4 else "bf16",
        "dense": "bf16 (FP8 dequantized at load)",
        "total_gib": round(sum(memory.values()), 3),
        "fits_one_h200": sum(memory.values()) * GIB <= H200_BYTES,
        "h200s_needed": needed or "more than 256",
    }
    embedding = cfg.vocab_size * cfg.hidden_size
    return Report(
        total,
        active,
        active - embedding,
        routed,
        dict(dtypes),
        unmapped,
        {k: round(v, 4) for k, v in memory.items()},
        plan,
    )


def render(report: Report) -> str:
    lines = [
        f"total parameters   {report.total_params:,} ({report.total_params / 1e9:.2f} B)",
        f"active per token   {report.active_params:,} ({report.active_params / 1e9:.2f} B; "
        f"{report.active_params_without_embedding / 1e9:.2f} B without the embedding table)",
        f"routed experts     {report.routed_expert_params:,}",
        "tensors by dtype   " + (", ".join(f"{k}: {v}" for k, v in sorted(report.tensors_by_dtype.items())) or "-"),
        f"unmapped tensors   {len(report.unmapped_tensors)}"
        + "".join(f"\n  {t}" for t in report.unmapped_tensors[:20]),
        "memory plan (GiB per device; experts and sequences spread over the devices, the rest on each; "
        + ", ".join(f"{k} {v}" for k, v in report.plan.items())
        + ")",
    ]
    lines += [f"  {region:<24} {gib:10.3f}" for region, gib in report.memory_gib.items()]
    return "\n".join(lines)
