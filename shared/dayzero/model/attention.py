"""Shared-KV MQA with low-rank query, partial RoPE, attention sink, sliding window and
compressed entries (CSA: indexer-selected, HCA: all causal); grouped low-rank output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import CSA, HCA, SLIDING, ModelConfig
from ..kernels import CompressedKeys, indexer_topk, write_window
from ..kernels.norms import rms_norm, rms_scale
from ..kv.pools import KVPools
from ..parallel import Group
from .compressor import CompressorSlots, fold
from .plan import StepPlan
from .rope import apply_rope
from .weights import Attention


def _compressed_keys(
    w: Attention,
    cfg: ModelConfig,
    layer: int,
    x: torch.Tensor,
    q_res: torch.Tensor,
    plan: StepPlan,
    pools: KVPools,
    comm: Group,
) -> CompressedKeys:
    """Fold the step into the layer's compressed pools, then say which entries each query reads.

    A tensor-parallel rank scores with its own indexer heads; the scores are summed over the
    ranks before the top-k, so every rank selects the same entries."""
    kind, eps, layout = cfg.layer_types[layer], cfg.rms_norm_eps, pools.layout
    pool_name = "compressed_csa" if kind == CSA else "compressed_hca"
    index = (layout.csa_layers if kind == CSA else layout.hca_layers).index(layer)
    pool, table = pools.compressed[pool_name][index], plan.tables[pool_name]
    prefix = "csa" if kind == CSA else "hca"
    fold(
        w.compressor,
        CompressorSlots(*pools.compressor_state(prefix, index)),
        F.linear(x, w.compressor.wkv.weight),
        F.linear(x, w.compressor.wgate.weight),
        plan,
        pool,
        table,
        eps,
    )
    rate, batch = cfg.compress_rate(layer), plan.batch
    visible, longest = plan.visible[rate], plan.longest[rate]  # the longest: known on the host, no sync
    if kind == HCA or not plan.options.sparse:
        if kind == CSA:  # the indexer's state still advances, so selection can be switched back on
            _index_keys(w, cfg, index, x, plan, pools)
        return CompressedKeys(pool, table, visible=visible, visible_max=longest)
    keys = _index_keys(w, cfg, index, x, plan, pools)
    heads = comm.config.part(cfg.index_n_heads)
    table, backend = plan.tables["index_keys"], plan.options.backend
    iq = F.linear(q_res, w.indexer.wq_b.weight).view(x.shape[0], heads, cfg.index_head_dim)
    iq = apply_rope(iq, plan.rope_compress, backend=backend)
    iw = F.linear(x, w.indexer.weights_proj.weight) * cfg.index_n_heads**-0.5
    picked = indexer_topk(
        iq, iw, batch, keys, table, visible, cfg.index_topk, backend, visible_max=longest, reduce=comm.all_reduce_sum
    )
    return CompressedKeys(pool, table, indices=picked)


def _index_keys(
    w: Attention, cfg: ModelConfig, index: int, x: torch.Tensor, plan: StepPlan, pools: KVPools
) -> torch.Tensor:
    ix = w.indexer.compressor
    keys = pools.compressed["index_keys"][index]
    fold(
        ix,
        CompressorSlots(*pools.compressor_state("index", index)),
        F.linear(x, ix.wkv.weight),
        F.linear(x, ix.wgate.weight),
        plan,
        keys,
        plan.tables["index_keys"],
        cfg.rms_norm_eps,
    )
    return keys


def attention(
    w: Attention, cfg: ModelConfig, layer: int, x: torch.Tensor, plan: StepPlan, pools: KVPools, comm: Group
) -> torch.Tensor:
    """x [T, hidden] (packed, normed) -> [T, hidden]; appends the step to the layer's pools.

    Over ``comm``'s ranks each holds its own query heads and output groups, the single KV head
    and every pool whole; ``wo_b``'s partial sums are all-reduced."""
    kind, eps, backend = cfg.layer_type(layer), cfg.rms_norm_eps, plan.options.backend
    rope = plan.rope_main if kind == SLIDING else plan.rope_compress
    n_tokens = x.shape[0]
    q_res = rms_norm(F.linear(x, w.wq_a.weight), w.q_norm.weight, eps, backend)
    heads, groups = comm.config.part(cfg.num_heads), comm.config.part(cfg.o_groups)
    q = rms_scale(F.linear(q_res, w.wq_b.weight).view(n_tokens, heads, cfg.head_dim), eps, backend)
    q = apply_rope(q, rope, backend=backend)
    kv = apply_rope(rms_norm(F.linear(x, w.wkv.weight), w.norm.weight, eps, backend), rope, backend=backend)  # [T, D]
    compressed = None if kind == SLIDING else _compressed_keys(w, cfg, layer, x, q_res, plan, pools, comm)
    window = pools.window[layer]
    out = plan.attend(
        q,
        kv,
        plan.batch,
        window,
        plan.window_table,
        cfg.sliding_window,
        w.attn_sink,
        compressed,
        backend=backend,
    )
    at = plan.ring.write_at if plan.ring is not None else None
    write_window(kv, plan.batch, window, plan.window_table, backend, at)
    out = apply_rope(out, rope, inverse=True, backend=backend)  # K = V carried RoPE into the output: undo it
    wo_a = w.wo_a.weight.view(groups, cfg.o_lora_rank, -1)  # [G, O, I]
    low_rank = torch.bmm(out.view(n_tokens, groups, -1).transpose(0, 1), wo_a.transpose(1, 2))  # [G, T, O]
    low_rank = low_rank.transpose(0, 1).flatten(1)  # [T, G * O]
    return comm.all_reduce_sum(F.linear(low_rank, w.wo_b.weight))
