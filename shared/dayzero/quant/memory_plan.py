"""The memory plan of ``dayzero inspect``: the bytes a device (or one rank of a tensor-parallel group)
holds by region, from the config's shapes alone."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from ..config import ModelConfig
from ..kv.layout import GROWING_POOLS, PoolLayout
from ..model.weights import skeleton
from ..parallel import ParallelError, check_divisible
from ..parallel.shard import split_dim

GIB = 1 << 30
H200_BYTES = 141e9  # one H200's HBM, as sold (about 131 GiB)


@dataclass(frozen=True, slots=True)
class Serving:
    """What each sequence and weight takes: ``width`` bytes a value of DAYZERO_DTYPE, which the dense
    weights, experts not kept in FP4, the dequant workspace and the attention state are held in."""

    batch: int
    context: int
    fp4: bool  # routed experts kept packed (FP4), dequantized per call
    width: int
    mtp_layers: int = 0  # the MTP layers shipped: the loader holds their weights
    mtp_state: bool = False  # DAYZERO_SPECULATIVE_TOKENS > 0: each sequence holds the MTP layer's state too


def parameters(cfg: ModelConfig, mtp_layers: int = 0) -> Iterator[tuple[str, int]]:
    """(name, values) of each parameter of the model the loader builds with ``mtp_layers`` MTP layers
    (``mtp.N.*`` after the main model's); the buffers (routing correction bias, hash-routing table) aside."""
    for name, t in skeleton(cfg, mtp_layers=mtp_layers).state_dict().items():
        if not name.endswith(("tid2eid", "gate.bias")):
            yield name, t.numel()


def mtp_plan(cfg: ModelConfig, serving: Serving) -> dict[str, int]:
    """What the MTP layers add to the plan (none: transformers' count leaves them out): their
    parameters and bytes (in ``packed_weights``), and the bytes each sequence holds for them (in
    ``attention_pools``: the MTP layer's window and the streams it has yet to read; 0 without
    speculative decoding)."""
    params = routed = 0
    for name, values in parameters(cfg, serving.mtp_layers):
        if name.startswith("mtp."):
            params += values
            routed += values if ".ffn.experts." in name else 0
    state = _state_bytes(cfg, serving)[1] - _state_bytes(cfg, replace(serving, mtp_state=False))[1]
    return {
        "layers": serving.mtp_layers,
        "params": params,
        "routed_expert_params": routed,
        "weight_bytes": round(_weight_bytes(params, routed, serving)),
        "state_bytes_per_sequence": round(state),
    }


def memory_plan(
    cfg: ModelConfig, total: int, routed: int, serving: Serving, devices: int, expert_cache_gib: float
) -> dict[str, float]:
    """GiB per device by region (experts FP4 when ``serving.fp4``; experts split over devices)."""
    batch, width = serving.batch, serving.width
    workspace = _workspace(cfg, serving, cfg.n_routed_experts) if serving.fp4 else 0
    per_token, window = _state_bytes(cfg, serving)
    pools = batch * (serving.context * per_token + window)
    hyper = batch * cfg.hc_mult * cfg.hidden_size * 4 * 2  # residual streams + mixed copy, fp32
    activations = 2048 * cfg.hidden_size * width * 8  # one prefill chunk, a few live [T, hidden] buffers
    return {
        "packed_weights": _weight_bytes(total, routed, serving, devices) / GIB,
        "dequant_workspace": workspace / GIB,
        "expert_cache": expert_cache_gib if serving.fp4 else 0.0,
        "attention_pools": pools / devices / GIB,
        "hyper_connection_state": hyper / GIB,
        "activations": activations / GIB,
    }


def _weight_bytes(params: int, routed: int, serving: Serving, devices: int = 1) -> float:
    """Bytes of ``params`` parameters, ``routed`` of them routed experts' spread over ``devices``."""
    return routed * _expert_bytes_per_value(serving) / devices + (params - routed) * serving.width


def _expert_bytes_per_value(serving: Serving) -> float:
    return 0.5 + 1 / 32 if serving.fp4 else serving.width  # FP4: half a byte and a 1-byte scale per 32


def _workspace(cfg: ModelConfig, serving: Serving, experts: int) -> int:
    """Dequantized experts of one MoE call: at most the experts a batch routes to."""
    routed = min(experts, serving.batch * cfg.num_experts_per_tok)
    return routed * 3 * cfg.moe_intermediate_size * cfg.hidden_size * serving.width


def _state_bytes(cfg: ModelConfig, serving: Serving) -> tuple[float, float]:
    """Attention state of one sequence: (bytes per token, fixed bytes: window + compressor)."""
    width = serving.width
    layout = PoolLayout.of(cfg, 64, "bfloat16" if width == 2 else "float32", mtp=serving.mtp_state)
    per_token = sum(layout.row_bytes(p, width) / layout.rate(p) for p in GROWING_POOLS)
    return per_token, layout.window_capacity * layout.row_bytes("window", width) + layout.row_bytes("compressor", 4)


def rank_plan(cfg: ModelConfig, ranks: int, serving: Serving) -> dict[str, float]:
    """Bytes one rank of a ``ranks``-way tensor-parallel group holds, by region (dayzero.parallel.shard):
    its routed experts, its slices of the split dense weights, the replicated dense weights, the
    attention state (replicated: every rank holds every sequence's whole state), the dequant
    workspace, and the hyper-connection state and activations (replicated, as ``memory_plan``)."""
    regions = {"routed_experts": 0.0, "dense_split": 0.0, "dense_replicated": 0.0}
    for name, values in parameters(cfg, serving.mtp_layers):
        if ".ffn.experts." in name:
            regions["routed_experts"] += values * _expert_bytes_per_value(serving) / ranks
        elif split_dim(name) is not None:
            regions["dense_split"] += values * serving.width / ranks
        else:
            regions["dense_replicated"] += values * serving.width
    per_token, window = _state_bytes(cfg, replace(serving, mtp_state=False))  # (a group drafts no tokens)
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
        "attention_state_bytes_per_token": round(_state_bytes(cfg, serving)[0], 1),
        "fits_h200": sum(plan.values()) <= H200_BYTES,
        "smallest_fitting_h200_group": ranks_needed(cfg, serving),
    }


def device_bytes(cfg: ModelConfig, total: int, routed: int, serving: Serving, devices: int, cache: float) -> float:
    """Bytes one device holds when the experts and sequences are spread over ``devices``."""
    return sum(memory_plan(cfg, total, routed, serving, devices, cache).values()) * GIB
