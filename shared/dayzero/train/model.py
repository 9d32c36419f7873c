"""The trained demo's architecture: transformers' ``DeepseekV4ForCausalLM`` plus one MTP layer.

The MTP layer is DeepSeek's MTPBlock built from transformers' own V4 parts (its decoder layer,
hyper-connection head and RMSNorm), an independent reference of the MTP maths dayzero loads as
``mtp.0.*``. At position t it reads the main model's final hyper-connection streams ``h_t``
(before ``hc_head``) and the embedding of token t+1, and predicts token t+2:

    x = e_proj(enorm(embed(ids[t+1])))[:, None] + h_proj(hnorm(h_t))     # [B, T-1, hc_mult, D]
    x = block(x)                      # sliding attention + score-routed MoE, layer num_layers
    logits = head(norm(hc_head(x)))   # its own hc_head and norm; embed and head shared
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
from transformers.masking_utils import create_sliding_window_causal_mask
from transformers.models.deepseek_v4.modeling_deepseek_v4 import (
    DeepseekV4DecoderLayer,
    DeepseekV4HyperHead,
    DeepseekV4RMSNorm,
)

SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"

TRAIN_CONFIG: dict[str, Any] = {
    "model_type": "deepseek_v4",
    "vocab_size": 2048,
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "head_dim": 32,
    "partial_rotary_factor": 0.5,
    "q_lora_rank": 64,
    "o_groups": 2,
    "o_lora_rank": 32,
    "sliding_window": 32,
    "layer_types": [SLIDING, CSA, HCA, CSA],
    "compress_rates": {CSA: 4, HCA: 16},
    "index_n_heads": 4,
    "index_head_dim": 32,
    "index_topk": 8,
    "hc_mult": 4,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,
    "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"],
    "bos_token_id": 0,
    "eos_token_id": 1,
    "max_position_embeddings": 4096,
    "num_nextn_predict_layers": 1,
}


def mtp_config(config: DeepseekV4Config) -> DeepseekV4Config:
    """``config`` with one more layer type: the MTP block (index num_layers) is sliding + top-k MoE."""
    extended = copy.deepcopy(config)
    extended.layer_types = [*config.layer_types, SLIDING]
    extended.mlp_layer_types = [*config.mlp_layer_types, "moe"]
    return extended


class MTP(nn.Module):
    """``mtp.0`` (names as transformers' parts: ``block`` is the decoder layer, ``hc_head`` its collapse)."""

    def __init__(self, config: DeepseekV4Config) -> None:
        super().__init__()
        dim, eps = config.hidden_size, config.rms_norm_eps
        self.enorm, self.hnorm = DeepseekV4RMSNorm(dim, eps), DeepseekV4RMSNorm(dim, eps)
        self.e_proj = nn.Linear(dim, dim, bias=False)
        self.h_proj = nn.Linear(dim, dim, bias=False)
        self.block = DeepseekV4DecoderLayer(mtp_config(config), config.num_hidden_layers)
        self.hc_head = DeepseekV4HyperHead(config)
        self.norm = DeepseekV4RMSNorm(dim, eps)

    def forward(self, streams: torch.Tensor, next_embeds: torch.Tensor, **block_kwargs: Any) -> torch.Tensor:
        """streams [B, T, N, D] (h_t), next_embeds [B, T, D] (embed of token t+1) -> hidden [B, T, D]."""
        x = self.e_proj(self.enorm(next_embeds)).unsqueeze(2) + self.h_proj(self.hnorm(streams))  # [B, T, N, D]
        x = self.block(x, **block_kwargs)
        return self.norm(self.hc_head(x))


@dataclass(frozen=True, slots=True)
class Logits:
    next: torch.Tensor  # [B, T, V]: token t+1 at position t
    after_next: torch.Tensor  # [B, T-1, V]: MTP's token t+2 at position t


class DemoModel(nn.Module):
    """The main model and its MTP layer, trained (and evaluated) together."""

    def __init__(self, lm: DeepseekV4ForCausalLM, mtp: MTP) -> None:
        super().__init__()
        self.lm, self.mtp = lm, mtp

    def forward(self, ids: torch.Tensor) -> Logits:
        """ids [B, T] -> main logits and MTP logits (see ``Logits``)."""
        captured: list[torch.Tensor] = []
        hook = self.lm.model.hc_head.register_forward_pre_hook(lambda _, args: captured.append(args[0]))
        try:
            logits = self.lm(input_ids=ids, use_cache=False).logits
        finally:
            hook.remove()
        streams = captured[0][:, :-1]  # [B, T-1, N, D]: the main model's streams before hc_head
        return Logits(logits, self.lm.lm_head(self.mtp_hidden(streams, ids[:, 1:])))

    def mtp_hidden(self, streams: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """streams [B, T, N, D], next_ids [B, T] -> MTP's final hidden [B, T, D] (positions 0..T-1)."""
        embeds = self.lm.model.embed_tokens(next_ids)
        positions = torch.arange(next_ids.shape[1], device=next_ids.device)[None]
        mask = create_sliding_window_causal_mask(
            config=self.lm.config, inputs_embeds=embeds, attention_mask=None, cache=None, position_ids=positions
        )
        rope = {"main": self.lm.model.rotary_emb(embeds, position_ids=positions, layer_type="main")}
        return self.mtp(streams, embeds, position_embeddings=rope, position_ids=positions, attention_mask=mask)


def build(raw_config: dict[str, Any], seed: int) -> DemoModel:
    """A freshly initialised model (fp32): transformers' init for every part, a random hash table."""
    torch.manual_seed(seed)
    config = DeepseekV4Config(**{k: v for k, v in raw_config.items() if k != "model_type"})
    lm = DeepseekV4ForCausalLM(config)
    mtp = MTP(config)
    mtp.apply(lm._init_weights)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, buf in lm.named_buffers():
            if name.endswith("tid2eid"):  # each token's fixed experts, distinct
                picks = [torch.randperm(config.n_routed_experts, generator=gen)[: buf.shape[1]] for _ in buf]
                buf.copy_(torch.stack(picks))
    return DemoModel(lm, mtp)
