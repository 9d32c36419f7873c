"""The router's expert weights: transformers' TopKRouter for sigmoid / sqrtsoftplus, DeepSeek's
``Gate`` by hand for softmax (transformers 5.24 has no 'softmax' activation to build it with).

DeepSeek's reference renormalises the chosen scores only when ``score_func != "softmax"``:
softmax scores already share one unit of mass over every expert.
"""

from __future__ import annotations

import pytest
import torch

from dayzero.config import ModelConfig
from dayzero.model.moe import route
from dayzero.model.weights import MoE

from .conftest import tiny_config


def _gate(scoring: str) -> tuple[ModelConfig, MoE, torch.Tensor]:
    cfg = ModelConfig.from_dict(tiny_config(scoring_func=scoring, routed_scaling_factor=2.5))
    w = MoE(cfg, layer=1, packed=False)  # layer 1: score-routed
    gen = torch.Generator().manual_seed(0)
    w.gate.weight.data = torch.randn(cfg.n_routed_experts, cfg.hidden_size, generator=gen)
    w.gate.bias.data = 0.1 * torch.randn(cfg.n_routed_experts, generator=gen)
    return cfg, w, torch.randn(7, cfg.hidden_size, generator=gen)


def test_softmax_scores_are_not_renormalised():
    cfg, w, x = _gate("softmax")
    experts, weights = route(w, cfg, x, torch.zeros(7, dtype=torch.long))
    scores = (x @ w.gate.weight.T).softmax(dim=-1)
    want = (scores + w.gate.bias).topk(cfg.num_experts_per_tok, dim=-1).indices
    assert torch.equal(experts.sort(dim=-1).values, want.sort(dim=-1).values)
    assert torch.allclose(weights, scores.gather(1, experts) * 2.5, atol=1e-6)
    assert (weights.sum(dim=-1) < 2.5 - 1e-3).all()  # the unchosen experts' mass stays out


@pytest.mark.parametrize("scoring", ["sigmoid", "sqrtsoftplus"])
def test_other_scores_follow_transformers_router(scoring):
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4TopKRouter

    cfg, w, x = _gate(scoring)
    fields = {k: v for k, v in cfg.raw.items() if k != "model_type"}
    router = DeepseekV4TopKRouter(DeepseekV4Config(**fields))
    router.weight.data, router.e_score_correction_bias.data = w.gate.weight.data, w.gate.bias.data
    _, ref_weights, ref_experts = router(x)
    experts, weights = route(w, cfg, x, torch.zeros(7, dtype=torch.long))
    order, ref_order = experts.argsort(dim=-1), ref_experts.argsort(dim=-1)
    assert torch.equal(experts.gather(1, order), ref_experts.gather(1, ref_order))
    assert torch.allclose(weights.gather(1, order), ref_weights.gather(1, ref_order), atol=1e-6)
