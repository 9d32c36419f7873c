"""``dayzero inspect``: parameter counts, tensor dtypes and a memory plan, from headers and config only.

Counting convention (as transformers counts ``DeepseekV4ForCausalLM`` parameters): every
learned weight, embeddings and the output head included; the routing correction bias and
the hash-routing table are buffers, not parameters; the MTP layer is not instantiated.
Active parameters per token: everything except the routed experts, plus the
``num_experts_per_tok`` routed experts each MoE layer uses.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..checkpoint import check_split, packed_experts
from ..config import ConfigError, ModelConfig
from ..kv.layout import GROWING_POOLS, PoolLayout
from ..model.weights import skeleton
from ..parallel import ParallelError, check_divisible
from ..parallel.shard import split_dim
from ..settings import Settings

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
class Serving:
    """What each sequence and weight takes: ``width`` bytes a value of DAYZERO_DTYPE, which the dense
    weights, experts not kept in FP4, the dequant workspace and the attention state are held in."""

    batch: int
    context: int
    fp4: bool  # routed experts kept packed (FP4), dequantized per call
    width: int


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
    cfg: ModelConfig, total: int, routed: int, serving: Serving, devices: int, expert_cache_gib: float
) -> dict[str, float]:
    """GiB per device by region (experts FP4 when ``serving.fp4``; experts split over devices)."""
    batch, width = serving.batch, serving.width
    experts_bytes = routed * _expert_bytes_per_value(serving)
    dense_bytes = (total - routed) * width
    workspace = _workspace(cfg, serving, cfg.n_routed_experts) if serving.fp4 else 0
    per_token, window = _state_bytes(cfg, width)
    pools = batch * (serving.context * per_token + window)
    hyper = batch * cfg.hc_mult * cfg.hidden_size * 4 * 2  # residual streams + mixed copy, fp32
    activations = 2048 * cfg.hidden_size * width * 8  # one prefill chunk, a few live [T, hidden] buffers
    return {
        "packed_weights": (experts_bytes / devices + dense_bytes) / GIB,
        "dequant_workspace": workspace / GIB,
        "expert_cache": expert_cache_gib if serving.fp4 else 0.0,
        "attention_pools": pools / devices / GIB,
        "hyper_connection_state": hyper / GIB,
        "activations": activations / GIB,
    }


def _expert_bytes_per_value(serving: Serving) -> float:
    return 0.5 + 1 / 32 if serving.fp4 else serving.width  # FP4: half a byte and a 1-byte scale per 32


def _workspace(cfg: ModelConfig, serving: Serving, experts: int) -> int:
    """Dequantized experts of one MoE call: at most the experts a batch routes to."""
    routed = min(experts, serving.batch * cfg.num_experts_per_tok)
    return routed * 3 * cfg.moe_intermediate_size * cfg.hidden_size * serving.width


def _state_bytes(cfg: ModelConfig, width: int) -> tuple[float, float]:
    """Attention state of one sequence: (bytes per token, fixed bytes: window + compressor)."""
    layout = PoolLayout.of(cfg, 64, "bfloat16" if width == 2 else "float32")
    per_token = sum(layout.row_bytes(p, width) / layout.rate(p) for p in GROWING_POOLS)
    return per_token, layout.window_capacity * layout.row_bytes("window", width) + layout.row_bytes("compressor", 4)


def rank_plan(cfg: ModelConfig, ranks: int, serving: Serving) -> dict[str, float]:
    """Bytes one rank of a ``ranks``-way tensor-parallel group holds, by region (dayzero.parallel.shard):
    its routed experts, its slices of the split dense weights, the replicated dense weights, the
    attention state (replicated: every rank holds every sequence's whole state), the dequant
    workspace, and the hyper-connection state and activations (replicated, as ``memory_plan``)."""
    regions = {"routed_experts": 0.0, "dense_split": 0.0, "dense_replicated": 0.0}
    for name, t in skeleton(cfg).state_dict().items():
        if name.endswith(("tid2eid", "gate.bias")):
            continue
        if ".ffn.experts." in name:
            regions["routed_experts"] += t.numel() * _expert_bytes_per_value(serving) / ranks
        elif split_dim(name) is not None:
            regions["dense_split"] += t.numel() * serving.width / ranks
        else:
            regions["dense_replicated"] += t.numel() * serving.width
    per_token, window = _state_bytes(cfg, serving.width)
    regions["attention_state_replicated"] = serving.batch * (serving.context * per_token + window)
    regions["dequant_workspace"] = _workspace(cfg, serving, cfg.n_routed_experts // ranks) if serving.fp4 else 0
    regions["hyper_connection_state"] = serving.batch * cfg.hc_mult * cfg.hidden_size * 4 * 2
    regions["activations"] = 2048 * cfg.hidden_size * serving.width * 8
    return regions


def ranks_needed(cfg: ModelConfig, serving: Serving, limit: int = 64) -> int | None:
    """The smallest tensor-parallel size that splits the config and fits each rank in one H200."""
    for n in range(1, limit + 1):
        try:
            check_divisible(cfg, n)
        except ParallelError:
            continue
        if sum(rank_plan(cfg, n, serving).values()) <= H200_BYTES:
            return n
    return None


def tensor_parallel_report(cfg: ModelConfig, ranks: int, serving: Serving) -> dict:
    """What ``inspect --tensor-parallel N`` prints: GiB per rank by region, the attention state per
    token (replicated on every rank), and the smallest group that fits on H200s."""
    check_divisible(cfg, ranks)
    plan = rank_plan(cfg, ranks, serving)
    return {
        "ranks": ranks,
        "gib_per_rank": {k: round(v / GIB, 4) for k, v in plan.items()},
        "total_gib_per_rank": round(sum(plan.values()) / GIB, 3),
        "attention_state_bytes_per_token": round(_state_bytes(cfg, serving.width)[0], 1),
        "fits_h200": sum(plan.values()) <= H200_BYTES,
        "smallest_fitting_h200_group": ranks_needed(cfg, serving),
    }


def _total(cfg: ModelConfig, total: int, routed: int, serving: Serving, devices: int, cache: float) -> float:
    """Bytes one device holds when the experts and sequences are spread over ``devices``."""
    return sum(memory_plan(cfg, total, routed, serving, devices, cache).values()) * GIB


def _config(path: str | Path) -> ModelConfig:
    """A released config by its name, else a checkpoint directory's or a config.json's."""
    if str(path) in PRESETS:
        return ModelConfig.from_dict(PRESETS[str(path)])
    if str(path) and not Path(path).exists():  # a name mistyped (deepseek-ai/DeepSeek-V4-Flash) was "no config.json"
        raise ConfigError(f"no checkpoint or config.json at {path}, nor a released config: {', '.join(PRESETS)}")
    return ModelConfig.from_file(path)


def inspect(
    path: str | Path,
    batch: int = 1,
    context: int | None = None,
    devices: int = 1,
    expert_cache_gib: float = 0.0,
    tensor_parallel: int = 1,
    dtype: str = Settings.model_fields["dtype"].default,
) -> Report:
    """``dtype``: DAYZERO_DTYPE of the run planned for (the settings object's)."""
    cfg = _config(path)
    longest = cfg.max_position_embeddings
    context = min(65536, longest) if context is None else context
    if context > longest:
        raise ValueError(f"--context {context} is past the model's (max_position_embeddings {longest})")
    if cfg.n_routed_experts % devices:
        raise ValueError(f"--devices {devices} does not divide the model's {cfg.n_routed_experts} routed experts")
    path = Path(path)
    total, active, routed = count_params(cfg)
    dtypes: Counter[str] = Counter()
    unmapped: list[str] = []
    if path.is_dir() and (any(path.glob("*.safetensors")) or (path / "model.safetensors.index.json").exists()):
        headers = check_split(path, [tensor_parallel], cfg)  # the config's shapes must be the weights', and split
        dtypes.update(e.dtype_name for e in headers.entries)
        unmapped = [e.key for e in headers.unused]
    fp4 = packed_experts(cfg) if dtypes else True  # a bare config: plan for the published FP4 experts
    serving = Serving(batch, context, fp4, 2 if dtype == "bfloat16" else 4)
    memory = memory_plan(cfg, total, routed, serving, devices, expert_cache_gib)
    fits = (n for n in range(1, 257) if _total(cfg, total, routed, serving, n, expert_cache_gib) <= H200_BYTES)
    fp8 = "float8_e4m3fn" in dtypes or not dtypes  # (a bare config: the release's FP8 dense weights)
    plan = {
        "batch": batch,
        "context": context,
        "devices": devices,
        "experts": "fp4" if fp4 else dtype,
        "dense": f"{dtype} (DAYZERO_DTYPE{'; FP8 dequantized at load' if fp8 else ''})",
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
        tensor_parallel_report(cfg, tensor_parallel, serving) if tensor_parallel > 1 else {},
    )


def _scaled(count: int) -> str:
    """``count`` in the largest unit it reaches: 284.33 B, 1.57 T, 437.68 K (a tiny model's was 0.00 B)."""
    for unit, name in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if count >= unit:
            return f"{count / unit:.2f} {name}"
    return str(count)


def render(report: Report) -> str:
    lines = [
        f"total parameters   {report.total_params:,} ({_scaled(report.total_params)})",
        f"active per token   {report.active_params:,} ({_scaled(report.active_params)}; "
        f"{_scaled(report.active_params_without_embedding)} without the embedding table)",
        f"routed experts     {report.routed_expert_params:,}",
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
