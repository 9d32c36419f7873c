"""The forward passes: ``prefill`` (prompts, chunked) and ``decode`` (one token per sequence).

Both run packed tokens of several sequences through the same layers; every sequence
carries its own ``SequenceState``, which the pass extends in place.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .attention import attention
from .hyper import collapse, head_collapse
from .moe import moe
from .norms import rms_norm
from .plan import StepPlan, plan_step
from .state import SequenceState
from .weights import Transformer


def _layers(
    model: Transformer,
    plan: StepPlan,
    states: list[SequenceState],
    embeds: torch.Tensor | None,
    capture: list[torch.Tensor] | None,
) -> torch.Tensor:
    """Packed tokens -> final normed hidden states [T, hidden]."""
    cfg = model.cfg
    eps, iters, hc_eps = cfg.rms_norm_eps, cfg.hc_sinkhorn_iters, cfg.hc_eps
    x = model.embed(plan.token_ids) if embeds is None else embeds
    streams = x.unsqueeze(1).expand(-1, cfg.hc_mult, -1).contiguous()  # [T, N, D]
    for i, block in enumerate(model.layers):
        layer_states = [s.layers[i] for s in states]
        h, mix = collapse(streams, block.hc_attn_fn, block.hc_attn_base, block.hc_attn_scale, iters, hc_eps, eps)
        h = attention(block.attn, cfg, i, rms_norm(h, block.attn_norm.weight, eps), plan, layer_states)
        streams = mix.merge(streams, h)
        h, mix = collapse(streams, block.hc_ffn_fn, block.hc_ffn_base, block.hc_ffn_scale, iters, hc_eps, eps)
        streams = mix.merge(streams, moe(block.ffn, cfg, rms_norm(h, block.ffn_norm.weight, eps), plan.token_ids))
        if capture is not None:
            capture.append(streams)
    for state, (_, n) in zip(states, plan.spans, strict=True):
        state.length += n
    collapsed = head_collapse(streams, model.hc_head_fn, model.hc_head_base, model.hc_head_scale, hc_eps, eps)
    hidden = rms_norm(collapsed, model.norm.weight, eps)
    if capture is not None:
        capture.append(hidden)
    return hidden


def _device(model: Transformer) -> torch.device:
    return model.head.weight.device


@torch.inference_mode()
def prefill(
    model: Transformer,
    prompts: list[list[int]],
    states: list[SequenceState],
    chunk_size: int = 2048,
    embeds: list[torch.Tensor | None] | None = None,
) -> torch.Tensor:
    """Feed each prompt (continuing its state) in chunks; -> logits of each last token [B, V].

    ``embeds[s]`` optionally replaces prompt ``s``'s token embeddings ([len, hidden]).
    """
    if any(not p for p in prompts):
        raise ValueError("prompts must not be empty")
    last = torch.empty(len(prompts), model.cfg.hidden_size, dtype=model.head.weight.dtype, device=_device(model))
    for begin in range(0, max(len(p) for p in prompts), chunk_size):
        active = [s for s, p in enumerate(prompts) if len(p) > begin]
        chunks = [prompts[s][begin : begin + chunk_size] for s in active]
        plan = plan_step(model.cfg, [states[s].length for s in active], chunks, _device(model))
        chunk_embeds = None
        if embeds is not None and any(embeds[s] is not None for s in active):
            chunk_embeds = torch.cat([
                model.embed(plan.token_ids[off : off + n]) if embeds[s] is None else embeds[s][begin : begin + n]
                for s, (off, n) in zip(active, plan.spans, strict=True)
            ])
        hidden = _layers(model, plan, [states[s] for s in active], chunk_embeds, None)
        for s, row in zip(active, plan.last_rows().tolist(), strict=True):
            if len(prompts[s]) <= begin + chunk_size:
                last[s] = hidden[row]
    return F.linear(last, model.head.weight).float()


@torch.inference_mode()
def decode(model: Transformer, tokens: list[int], states: list[SequenceState]) -> torch.Tensor:
    """One new token per sequence -> next-token logits [B, V]."""
    plan = plan_step(model.cfg, [s.length for s in states], [[t] for t in tokens], _device(model))
    return F.linear(_layers(model, plan, states, None, None), model.head.weight).float()


@torch.inference_mode()
def score(
    model: Transformer, ids: list[int], state: SequenceState, capture: list[torch.Tensor] | None = None
) -> torch.Tensor:
    """Logits at every position of ``ids`` in one pass [L, V].

    ``capture`` receives each layer's residual streams [L, N, D], then the final hidden [L, D].
    """
    plan = plan_step(model.cfg, [state.length], [ids], _device(model))
    return F.linear(_layers(model, plan, [state], None, capture), model.head.weight).float()
