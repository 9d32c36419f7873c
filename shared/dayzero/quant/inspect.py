"""``dayzero inspect``: parameter counts, tensor dtypes and a memory plan, from headers and config only.

Counting convention (as transformers counts ``DeepseekV4ForCausalLM`` parameters): every
learned weight, embeddings and the output head included; the routing correction bias and
the hash-routing table are buffers, not parameters; the MTP layer is not instantiated.
Active parameters per token: everything except the routed experts, plus the
``num_experts_per_tok`` routed experts each MoE layer uses. The memory plan holds what the
loader holds: the MTP layers shipped too (their weights; their state with speculative decoding).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..checkpoint import check_split, packed_experts
from ..config import ConfigError, ModelConfig
from ..device_shares import KV_WORKERS
from ..serving.budget import MIB, budget_pools
from ..settings import Settings
from ..settings_checks import refused_in_a_group
from ..speculative_checks import speculation_refused
from .memory_plan import (
    GIB,
    H200_BYTES,
    ModelTensors,
    Serving,
    WeightBytes,
    batch_state_bytes,
    device_bytes,
    memory_plan,
    mtp_plan,
    tensor_parallel_report,
)


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
    tensor_parallel: dict = field(default_factory=dict)  # inspect(..., tensor_parallel=N), N > 1
    mtp: dict = field(default_factory=dict)  # the MTP layers' share of the plan (memory_plan.mtp_plan)
    kv_pools: dict = field(default_factory=dict)  # the pools a worker allocates (kv_pools_of)

    def to_dict(self) -> dict:
        return asdict(self)


def count_params(cfg: ModelConfig, tensors: ModelTensors) -> tuple[int, int, int]:
    """(total, active per token, routed experts) parameter counts (the MTP layers' aside)."""
    total = routed = 0
    for name, values in tensors.params:
        if name.startswith("mtp."):
            continue
        total += values
        routed += values if ".ffn.experts." in name else 0
    active = total - routed + routed * cfg.num_experts_per_tok // cfg.n_routed_experts
    return total, active, routed


def _config(path: str | Path) -> ModelConfig:
    """A released config by its name, else a checkpoint directory's or a config.json's."""
    if str(path) in PRESETS:
        return ModelConfig.from_dict(PRESETS[str(path)])
    if str(path) and not Path(path).exists():  # a name mistyped (deepseek-ai/DeepSeek-V4-Flash) was "no config.json"
        raise ConfigError(f"no checkpoint or config.json at {path}, nor a released config: {', '.join(PRESETS)}")
    return ModelConfig.from_file(path)


def kv_pools_of(cfg: ModelConfig, settings: Settings, mtp_layers: int, tensor_parallel: int = 1) -> dict:
    """The pools a worker of ``settings`` allocates (``budget_pools``, as the runtime sizes them):
    their bytes and the longest sequence they hold; ``refused``, the worker's own error where it
    would not start (no worker starts: 0 bytes): drafts the checkpoint's ``mtp_layers`` cannot make,
    settings a group of ``tensor_parallel`` ranks refuses, a budget that cannot hold DAYZERO_MAX_BATCH
    sequences' windows."""
    kv = {"budget_mb": settings.kv_budget_mb, "windows": settings.max_batch + settings.decode_graphs}
    try:
        if refused := speculation_refused(cfg, mtp_layers, settings.speculative_tokens):
            raise ValueError(refused)
        for service in KV_WORKERS if tensor_parallel > 1 else ():
            refused_in_a_group(service, settings, tensor_parallel)
        pools, budget = budget_pools(settings, cfg)
    except ValueError as exc:
        return kv | {"bytes": 0, "capacity_tokens": 0, "refused": str(exc)}
    held = {"bytes": sum(t.nbytes for t in pools.tensors()), "capacity_tokens": pools.capacity_tokens()}
    return kv | held | {"budget_mb": round(budget.bytes / MIB, 1), "budget": budget.chosen_by}


def inspect(
    path: str | Path,
    batch: int = 1,
    context: int | None = None,
    devices: int = 1,
    expert_cache_gib: float = 0.0,
    tensor_parallel: int = 1,
    settings: Settings | None = None,
) -> Report:
    """The plan of a run of ``settings`` (the defaults, not the environment's, unless given): its
    DAYZERO_DTYPE, DAYZERO_SPECULATIVE_TOKENS, DAYZERO_BLOCK_SIZE, and the pools of DAYZERO_KV_BUDGET_MB,
    DAYZERO_MAX_BATCH and DAYZERO_DECODE_GRAPHS."""
    settings = settings or Settings.model_construct()
    cfg = _config(path)
    longest = cfg.max_position_embeddings
    context = min(65536, longest) if context is None else context
    if context > longest:
        raise ValueError(f"--context {context} is past the model's (max_position_embeddings {longest})")
    if cfg.n_routed_experts % devices:
        raise ValueError(f"--devices {devices} does not divide the model's {cfg.n_routed_experts} routed experts")
    path = Path(path)
    dtypes: Counter[str] = Counter()
    unmapped: list[str] = []
    mtp_layers = cfg.num_nextn_predict_layers  # a bare config: the layers it declares, as the releases ship them
    if path.is_dir() and (any(path.glob("*.safetensors")) or (path / "model.safetensors.index.json").exists()):
        headers = check_split(path, [tensor_parallel], cfg)  # the config's shapes must be the weights', and split
        dtypes.update(e.dtype_name for e in headers.entries)
        unmapped = [e.key for e in headers.unused]
        mtp_layers = headers.mtp_layers  # the loader holds those shipped, declared or not
    fp4 = packed_experts(cfg) if dtypes else True  # a bare config: plan for the published FP4 experts
    speculating = settings.speculative_tokens > 0 and mtp_layers > 0
    width = 2 if settings.dtype == "bfloat16" else 4
    kv = kv_pools_of(cfg, settings, mtp_layers, tensor_parallel)
    serving = Serving(batch, context, fp4, width, settings.block_size, mtp_layers, speculating, kv["bytes"])
    tensors = ModelTensors.of(cfg, serving)  # (the one skeleton built: ~0.15 s for V4-Flash's)
    total, active, routed = count_params(cfg, tensors)
    weights = WeightBytes.of(tensors)
    memory = memory_plan(cfg, weights, serving, devices, expert_cache_gib)
    counts = (n for n in range(1, 257) if cfg.n_routed_experts % n == 0)  # those --devices takes
    fits = (n for n in counts if device_bytes(cfg, weights, serving, n, expert_cache_gib) <= H200_BYTES)
    fp8 = "float8_e4m3fn" in dtypes or not dtypes  # (a bare config: the release's FP8 dense weights)
    plan = {
        "batch": batch,
        "context": context,
        "devices": devices,
        "experts": "fp4" if fp4 else settings.dtype,
        "dense": f"{settings.dtype} (DAYZERO_DTYPE{'; FP8 dequantized at load' if fp8 else ''})",
        "total_gib": round(sum(memory.values()), 3),
        "fits_one_h200": sum(memory.values()) * GIB <= H200_BYTES,
        "h200s_needed": next(fits, None) or "more than 256",
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
        tensor_parallel_report(cfg, tensor_parallel, serving, tensors) if tensor_parallel > 1 else {},
        mtp_plan(cfg, serving, tensors) | {"speculative_tokens": settings.speculative_tokens},
        kv | {"batch_bytes": batch_state_bytes(cfg, serving) // devices, "decode_graphs": settings.decode_graphs},
    )


def _scaled(count: int) -> str:
    """``count`` in the largest unit it reaches: 284.33 B, 1.57 T, 437.68 K (a tiny model's was 0.00 B)."""
    for unit, name in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if count >= unit:
            return f"{count / unit:.2f} {name}"
    return str(count)


def _mtp_line(mtp: dict) -> str:
    if not mtp["layers"]:
        return "MTP layers         none"
    state = (
        f"{mtp['state_bytes_per_sequence']:,} bytes of state a sequence (in attention_pools; "
        f"DAYZERO_SPECULATIVE_TOKENS {mtp['speculative_tokens']})"
        if mtp["state_bytes_per_sequence"]
        else "no state (DAYZERO_SPECULATIVE_TOKENS 0: no drafts)"
    )
    return (
        f"MTP layers         {mtp['layers']}: {mtp['params']:,} parameters, not in the counts above; "
        f"{mtp['weight_bytes']:,} bytes of weights (in packed_weights), {state}"
    )


def _kv_lines(kv: dict, plan: dict) -> list[str]:
    """What the attention_pools region counts: the pools a worker allocates, or the batch's state."""
    asked = f"--batch {plan['batch']} at --context {plan['context']}"
    if "refused" in kv:
        pools = f"none: a worker refuses to start ({kv['refused']}); attention_pools counts {asked}"
    else:
        pools = (
            f"{kv['bytes']:,} bytes a worker allocates (a budget of {kv['budget']}, windows for "
            f"{kv['windows']} sequences), one sequence up to {kv['capacity_tokens']:,} tokens"
        )
        if kv["batch_bytes"] > kv["bytes"]:
            pools += f"; under the {kv['batch_bytes']:,} bytes of {asked}, which attention_pools counts"
    lines = [f"KV pools           {pools}"]
    if kv["decode_graphs"]:
        lines.append(
            "CUDA graphs        DAYZERO_DECODE_GRAPHS: their padding rows' window is in the KV pools; the "
            "graphs' own memory (each captured bucket's activations and logits) is not in the plan"
        )
    return lines


def render(report: Report) -> str:
    lines = [
        f"total parameters   {report.total_params:,} ({_scaled(report.total_params)})",
        f"active per token   {report.active_params:,} ({_scaled(report.active_params)}; "
        f"{_scaled(report.active_params_without_embedding)} without the embedding table)",
        f"routed experts     {report.routed_expert_params:,}",
        _mtp_line(report.mtp),
        "tensors by dtype   "
        + (
            ", ".join(f"{k}: {v}" for k, v in sorted(report.tensors_by_dtype.items()))
            or "none: no weights read (the plan is the config's alone, with the release's FP4 experts)"
        ),
        f"unmapped tensors   {len(report.unmapped_tensors)}"
        + "".join(f"\n  {t}" for t in report.unmapped_tensors[:20]),
        "memory plan (GiB per device; experts and sequences spread over the devices, the rest on each; "
        + ", ".join(f"{k} {v}" for k, v in report.plan.items())
        + ")",
    ]
    lines += [f"  {region:<24} {gib:10.3f}" for region, gib in report.memory_gib.items()]
    lines += _kv_lines(report.kv_pools, report.plan)
    tp = report.tensor_parallel
    if tp:
        lines.append(
            f"tensor parallel {tp['ranks']} (GiB per rank; heads, experts, vocabulary split; the KV head, "
            f"compressors and hyper-connections replicated; batch {report.plan['batch']}, "
            f"context {report.plan['context']})"
        )
        lines += [f"  {region:<28} {gib:10.3f}" for region, gib in tp["gib_per_rank"].items()]
        lines.append(f"  {'total per rank':<28} {tp['total_gib_per_rank']:10.3f}  fits one H200: {tp['fits_h200']}")
        lines.append(
            f"  attention state {tp['attention_state_bytes_per_token']:,.0f} bytes per token, replicated: "
            "every rank holds every sequence's whole state"
        )
        lines.append(f"  smallest tensor-parallel group that fits on H200s: {tp['smallest_fitting_h200_group']}")
    return "\n".join(lines)
