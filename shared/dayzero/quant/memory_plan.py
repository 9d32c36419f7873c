"""The memory plan of ``dayzero inspect``: the bytes a device (or one rank of a tensor-parallel group)
holds by region, from the config's shapes alone: the weights as the loader keeps them
(checkpoint.load_model), the attention state in the blocks of DAYZERO_BLOCK_SIZE rows the runtime's
pools hold it in (kv.pools), or the pools a worker allocates for DAYZERO_KV_BUDGET_MB where those are more."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..config import ModelConfig
from ..kv.layout import GROWING_POOLS, PoolLayout
from ..model.weights import held_dtype, skeleton
from ..parallel import ParallelError, check_divisible
from ..parallel.shard import split_dim
from .experts import PackedExperts

GIB = 1 << 30
H200_BYTES = 141e9  # one H200's HBM, as sold (about 131 GiB)


@dataclass(frozen=True, slots=True)
class Serving:
    """What each sequence and weight takes: ``width`` bytes a value of DAYZERO_DTYPE, which the dense
    weights (but the fp32 ones: norms, hyper-connections, sinks, biases), experts not kept in FP4, the
    dequant workspace and the attention state are held in; ``block_size`` rows a pool block
    (DAYZERO_BLOCK_SIZE)."""

    batch: int
    context: int
    fp4: bool  # routed experts kept packed (FP4), dequantized per call
    width: int
    block_size: int
    mtp_layers: int = 0  # the MTP layers shipped: the loader holds their weights
    mtp_state: bool = False  # DAYZERO_SPECULATIVE_TOKENS > 0: each sequence holds the MTP layer's state too
    pool_bytes: int = 0  # the pools a worker allocates whatever its sequences (serving.budget.budget_pools)


@dataclass(frozen=True, slots=True)
class ModelTensors:
    """The model the loader builds, from one skeleton (a meta module tree, built once for the whole
    plan): ``params``, (name, values) of each parameter, routed experts as float weights (the count's
    convention), the buffers (routing correction bias, hash-routing table) aside; ``held``, (name,
    bytes) of each tensor the loader holds, buffers included, each in the dtype it holds it in
    (``held_dtype``), the routed experts packed when ``serving.fp4``. MTP layers: ``mtp.N.*``."""

    params: tuple[tuple[str, int], ...]
    held: tuple[tuple[str, int], ...]

    @staticmethod
    def of(cfg: ModelConfig, serving: Serving) -> ModelTensors:
        model = skeleton(cfg, mtp_layers=serving.mtp_layers)
        tensors = model.state_dict()
        params = tuple((n, t.numel()) for n, t in tensors.items() if not n.endswith(("tid2eid", "gate.bias")))
        if serving.fp4:  # the module the loader builds in their place (one, on meta: only its shapes are read)
            with torch.device("meta"):
                packed = PackedExperts(cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size)
            for block in (*model.layers, *model.mtp):
                block.ffn.experts = packed
            tensors = model.state_dict()
        dtype = getattr(torch, _dtype(serving))
        held = tuple((n, t.numel() * held_dtype(n, t.dtype, dtype).itemsize) for n, t in tensors.items())
        return ModelTensors(params, held)


@dataclass(frozen=True, slots=True)
class WeightBytes:
    """Bytes of the weights the loader holds: the routed experts' (spread over devices), the rest's."""

    experts: int
    rest: int

    @staticmethod
    def of(tensors: ModelTensors) -> WeightBytes:
        experts = rest = 0
        for name, size in tensors.held:
            if ".ffn.experts." in name:
                experts += size
            else:
                rest += size
        return WeightBytes(experts, rest)


def mtp_plan(cfg: ModelConfig, serving: Serving, tensors: ModelTensors) -> dict[str, int]:
    """What the MTP layers add to the plan (none: transformers' count leaves them out): their
    parameters and bytes (in ``packed_weights``), and the bytes each sequence holds for them (in
    ``attention_pools``: the MTP layer's window and the streams it has yet to read; 0 without
    speculative decoding)."""
    params = routed = 0
    for name, values in tensors.params:
        if name.startswith("mtp."):
            params += values
            routed += values if ".ffn.experts." in name else 0
    state = _sequence_bytes(cfg, serving) - _sequence_bytes(cfg, replace(serving, mtp_state=False))
    return {
        "layers": serving.mtp_layers,
        "params": params,
        "routed_expert_params": routed,
        "weight_bytes": sum(size for name, size in tensors.held if name.startswith("mtp.")),
        "state_bytes_per_sequence": state,
    }


def memory_plan(
    cfg: ModelConfig, weights: WeightBytes, serving: Serving, devices: int, expert_cache_gib: float
) -> dict[str, float]:
    """GiB per device by region (experts FP4 when ``serving.fp4``; experts split over devices). The
    attention pools: the ones a worker allocates (``serving.pool_bytes``), or the batch's sequences'
    state where that is more (what a budget that holds them allocates)."""
    batch, width = serving.batch, serving.width
    workspace = _workspace(cfg, serving, cfg.n_routed_experts) if serving.fp4 else 0
    pools = batch_state_bytes(cfg, serving)
    hyper = batch * cfg.hc_mult * cfg.hidden_size * 4 * 2  # residual streams + mixed copy, fp32
    activations = 2048 * cfg.hidden_size * width * 8  # one prefill chunk, a few live [T, hidden] buffers
    return {
        "packed_weights": (weights.experts / devices + weights.rest) / GIB,
        "dequant_workspace": workspace / GIB,
        "expert_cache": expert_cache_gib if serving.fp4 else 0.0,
        "attention_pools": max(serving.pool_bytes, pools / devices) / GIB,
        "hyper_connection_state": hyper / GIB,
        "activations": activations / GIB,
    }


def batch_state_bytes(cfg: ModelConfig, serving: Serving) -> int:
    """Attention state of the batch's ``serving.batch`` sequences of ``serving.context`` tokens."""
    return serving.batch * _sequence_bytes(cfg, serving)


def _workspace(cfg: ModelConfig, serving: Serving, experts: int) -> int:
    """Dequantized experts of one MoE call: at most the experts a batch routes to."""
    routed = min(experts, serving.batch * cfg.num_experts_per_tok)
    return routed * 3 * cfg.moe_intermediate_size * cfg.hidden_size * serving.width


def _dtype(serving: Serving) -> str:
    """DAYZERO_DTYPE's name, of ``serving.width`` bytes a value."""
    return "bfloat16" if serving.width == 2 else "float32"


def _layout(cfg: ModelConfig, serving: Serving) -> PoolLayout:
    return PoolLayout.of(cfg, serving.block_size, _dtype(serving), mtp=serving.mtp_state)


def _sequence_bytes(cfg: ModelConfig, serving: Serving) -> int:
    """Attention state of one sequence of ``serving.context`` tokens: the blocks the pools give it
    (whole blocks of ``block_size`` rows: its window ring, its growing pools' entries rounded up) and
    its compressor slot (fp32)."""
    layout = _layout(cfg, serving)
    blocks = layout.blocks_of(serving.context)
    rows = sum(blocks[p] * layout.block_size * layout.row_bytes(p, serving.width) for p in ("window", *GROWING_POOLS))
    return rows + blocks["compressor"] * layout.row_bytes("compressor", 4)


def _bytes_per_token(cfg: ModelConfig, serving: Serving) -> float:
    """Attention state one more token of a sequence adds, on average (its growing pools' entries)."""
    layout = _layout(cfg, serving)
    return sum(layout.row_bytes(p, serving.width) / layout.rate(p) for p in GROWING_POOLS)


def rank_plan(cfg: ModelConfig, ranks: int, serving: Serving, tensors: ModelTensors) -> dict[str, float]:
    """Bytes one rank of a ``ranks``-way tensor-parallel group holds, by region (dayzero.parallel.shard):
    its routed experts, its slices of the split dense weights, the replicated dense weights, the
    attention state (replicated: every rank holds every sequence's whole state; the pools it allocates
    where those are more, as ``memory_plan``), the dequant
    workspace, and the hyper-connection state and activations (replicated, as ``memory_plan``)."""
    regions = {"routed_experts": 0.0, "dense_split": 0.0, "dense_replicated": 0.0}
    for name, size in tensors.held:
        if ".ffn.experts." in name:
            regions["routed_experts"] += size / ranks
        elif split_dim(name) is not None:
            regions["dense_split"] += size / ranks
        else:
            regions["dense_replicated"] += size
    state = _sequence_bytes(cfg, replace(serving, mtp_state=False))  # (a group drafts no tokens)
    regions["attention_state_replicated"] = max(serving.pool_bytes, serving.batch * state)
    regions["dequant_workspace"] = _workspace(cfg, serving, cfg.n_routed_experts // ranks) if serving.fp4 else 0
    regions["hyper_connection_state"] = serving.batch * cfg.hc_mult * cfg.hidden_size * 4 * 2
    regions["activations"] = 2048 * cfg.hidden_size * serving.width * 8
    return regions


def ranks_needed(cfg: ModelConfig, serving: Serving, tensors: ModelTensors, limit: int = 64) -> int | None:
    """The smallest tensor-parallel size that splits the config and fits each rank in one H200."""
    for n in range(1, limit + 1):
        try:
            check_divisible(cfg, n)
        except ParallelError:
            continue
        if sum(rank_plan(cfg, n, serving, tensors).values()) <= H200_BYTES:
            return n
    return None


def tensor_parallel_report(cfg: ModelConfig, ranks: int, serving: Serving, tensors: ModelTensors) -> dict:
    """What ``inspect --tensor-parallel N`` prints: GiB per rank by region, the attention state per
    token (replicated on every rank), and the smallest group that fits on H200s."""
    check_divisible(cfg, ranks)
    plan = rank_plan(cfg, ranks, serving, tensors)
    return {
        "ranks": ranks,
        "gib_per_rank": {k: round(v / GIB, 4) for k, v in plan.items()},
        "total_gib_per_rank": round(sum(plan.values()) / GIB, 3),
        "attention_state_bytes_per_token": round(_bytes_per_token(cfg, serving), 1),
        "fits_h200": sum(plan.values()) <= H200_BYTES,
        "smallest_fitting_h200_group": ranks_needed(cfg, serving, tensors),
    }


def device_bytes(cfg: ModelConfig, weights: WeightBytes, serving: Serving, devices: int, cache: float) -> float:
    """Bytes one device holds when the experts and sequences are spread over ``devices``."""
    return sum(memory_plan(cfg, weights, serving, devices, cache).values()) * GIB
