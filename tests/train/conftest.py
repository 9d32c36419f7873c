"""A very tiny training config (every attention kind, hash + top-k MoE, hc_mult 4, one MTP layer)."""

from __future__ import annotations

import pytest

from dayzero.train.model import TRAIN_CONFIG

TINY = {
    **TRAIN_CONFIG,
    "vocab_size": 256,
    "hidden_size": 64,
    "q_lora_rank": 32,
    "o_lora_rank": 16,
    "head_dim": 32,
    "num_attention_heads": 2,
    "index_n_heads": 2,
    "index_head_dim": 32,
    "moe_intermediate_size": 64,
    "sliding_window": 8,
    "index_topk": 2,
    "n_routed_experts": 4,
}


@pytest.fixture(scope="session")
def tiny_config() -> dict:
    return dict(TINY)
