"""Shared-KV MQA with low-rank query, partial RoPE, attention sink, sliding window and
compressed (CSA: indexer-selected, HCA: all causal) entries; grouped low-rank output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import CSA, SLIDING, ModelConfig
from .compressor import compress, index_topk, visible_entries
from .norms import rms_norm, rms_scale
from .plan import StepPlan
from .rope import apply_rope
from .state import LayerState
from .weights import Attention


def attend(q: torch.Tensor, kv: torch.Tensor, allowed: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
    """Softmax attention with a per-head sink logit; keys are values (shared KV).

    q [L, H, D]; kv [K, D]; allowed [L, K] bool; sink [H] fp32. Returns [L, H, D].
    """
    logits = torch.einsum("lhd,kd->lhk", q, kv).float() * q.shape[-1] ** -0.5
    logits = logits.masked_fill(~allowed[:, None, :], float("-inf"))
    sinks = sink.float().view(1, -1, 1).expand(logits.shape[0], -1, 1)
    probs = torch.cat((logits, sinks), dim=-1).softmax(dim=-1)[..., :-1]
    return torch.einsum("lhk,kd->lhd", probs.to(kv.dtype), kv)


def _window_mask(query_pos: torch.Tensor, first_key_pos: int, n_keys: int, window: int) -> torch.Tensor:
    key_pos = torch.arange(first_key_pos, first_key_pos + n_keys, device=query_pos.device)
    delta = query_pos[:, None] - key_pos[None, :]
    return (delta >= 0) & (delta < window)


def attention(
    w: Attention, cfg: ModelConfig, layer: int, x: torch.Tensor, plan: StepPlan, states: list[LayerState]
) -> torch.Tensor:
    """x [T, hidden] (packed, normed) -> [T, hidden]; updates each sequence's layer state."""
    kind, rate, eps = cfg.layer_types[layer], cfg.compress_rate(layer), cfg.rms_norm_eps
    rope = plan.rope_main if kind == SLIDING else plan.rope_compress
    n_tokens = x.shape[0]
    q_res = rms_norm(w.wq_a(x), w.q_norm.weight, eps)
    q = apply_rope(rms_scale(w.wq_b(q_res).view(n_tokens, cfg.num_heads, cfg.head_dim), eps), rope)
    kv = apply_rope(rms_norm(w.wkv(x), w.norm.weight, eps), rope)  # [T, D]
    if kind != SLIDING:
        ckv, cgate = w.compressor.wkv(x), w.compressor.wgate(x)
    if kind == CSA:
        ix = w.indexer
        ikv, igate = ix.compressor.wkv(x), ix.compressor.wgate(x)
        iq = apply_rope(ix.wq_b(q_res).view(n_tokens, cfg.index_n_heads, cfg.index_head_dim), plan.rope_compress)
        iw = ix.weights_proj(x) * cfg.index_n_heads**-0.5

    out = torch.empty_like(q)
    for (offset, length), st in zip(plan.spans, states, strict=True):
        rows = slice(offset, offset + length)
        pos = plan.positions[rows]
        keys = torch.cat((st.window, kv[rows]))
        allowed = _window_mask(pos, int(pos[0]) - st.window.shape[0], keys.shape[0], cfg.sliding_window)
        st.window = keys[keys.shape[0] - min(keys.shape[0], cfg.sliding_window - 1) :]
        if kind != SLIDING:
            first = st.compressed.shape[0]
            new = compress(w.compressor, st.compressor, ckv[rows], cgate[rows], first, plan.freqs_compress, eps)
            st.compressed = torch.cat((st.compressed, new))
            visible = visible_entries(pos, rate)
            if kind == CSA:
                new_keys = compress(
                    ix.compressor, st.index_compressor, ikv[rows], igate[rows], first, plan.freqs_compress, eps
                )
                st.index_keys = torch.cat((st.index_keys, new_keys))
                picked = index_topk(iq[rows], iw[rows], st.index_keys, visible, cfg.index_topk)
            else:
                picked = torch.arange(st.compressed.shape[0], device=x.device)[None, :] < visible[:, None]
            keys = torch.cat((keys, st.compressed))
            allowed = torch.cat((allowed, picked), dim=1)
        out[rows] = attend(q[rows], keys, allowed, w.attn_sink)

    out = apply_rope(out, rope, inverse=True)  # K = V carried RoPE into the output: undo it
    groups = out.view(n_tokens, cfg.o_groups, -1)
    wo_a = w.wo_a.weight.view(cfg.o_groups, cfg.o_lora_rank, -1)
    return F.linear(torch.einsum("tgi,goi->tgo", groups, wo_a).flatten(1), w.wo_b.weight)
