"""The MTP layer's forward against transformers' DeepSeek-V4 parts on the same weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from dayzero.checkpoint import load_model
from dayzero.kv.pools import pools_for
from dayzero.model.forward import run_layers
from dayzero.model.mtp import mtp_forward
from dayzero.model.plan import AttentionOptions, plan_step
from dayzero.model.vocab import lm_logits

from .conftest import random_ids, tiny_config


@pytest.fixture(scope="module")
def model(mtp_checkpoint):
    return load_model(mtp_checkpoint, progress=False)


MTP_ONLY = ("e_proj.", "h_proj.", "enorm.", "hnorm.", "norm.", "hc_head_")


def _reference_mtp(checkpoint, tmp_path):
    """transformers' DeepseekV4ForCausalLM with one layer: the MTP block (a sliding-attention,
    score-routed decoder layer), the MTP's hc head and norm, the shared embedding and head."""
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    tensors = load_file(str(checkpoint / "model.safetensors"))
    layer = {
        f"layers.0.{k[6:]}": v for k, v in tensors.items() if k.startswith("mtp.0.") and not k[6:].startswith(MTP_ONLY)
    }
    head = {k[6:]: v for k, v in tensors.items() if k.startswith(("mtp.0.norm.", "mtp.0.hc_head_"))}
    save_file(
        {**layer, **head, "embed.weight": tensors["embed.weight"], "head.weight": tensors["head.weight"]},
        str(tmp_path / "model.safetensors"),
    )
    fields = {k: v for k, v in tiny_config().items() if k != "model_type"}
    one = {"num_hidden_layers": 1, "layer_types": ["sliding_attention"], "mlp_layer_types": ["moe"]}
    DeepseekV4Config(**{**fields, **one}).save_pretrained(tmp_path)
    ref = DeepseekV4ForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    return ref, {k[6:]: v for k, v in tensors.items() if k.startswith("mtp.0.") and k[6:].startswith(MTP_ONLY[:4])}


@pytest.mark.parametrize("backend", ["torch", "triton"])
@torch.inference_mode()
def test_mtp_forward_matches_transformers_parts(model, mtp_checkpoint, tmp_path, backend):
    """Our MTP layer over a prompt (fed each position's main streams and the next token) against
    transformers' decoder layer, RMSNorm and hc head on the same weights. fp32, the same maths in
    another summation order: 1e-5, as the main model's alignment. The MTP layer runs on each backend
    (the main layers on the twins): its prefill on the kernels, a prompt's rows past the window, is in
    no other test (test_speculative's Triton run prefills on the twins and replaces its drafts)."""
    from transformers.masking_utils import create_sliding_window_causal_mask
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4RMSNorm

    ref, extra = _reference_mtp(mtp_checkpoint, tmp_path)
    cfg, ids = model.cfg, random_ids(20, model.cfg.vocab_size, seed=12)  # 20 > the window of 8
    pools = pools_for(cfg, torch.float32, 32, mtp=True)
    pools.reserve("s", len(ids))
    streams = run_layers(model, plan_step(cfg, pools, ["s"], [0], [ids], AttentionOptions()), pools)
    plan = plan_step(cfg, pools, ["s"], [0], [ids[1:]], AttentionOptions(backend=backend))
    ours = lm_logits(model, mtp_forward(model, plan, pools, streams[:-1])[1])

    def norm(name: str, x: torch.Tensor) -> torch.Tensor:
        module = DeepseekV4RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        module.weight.copy_(extra[f"{name}.weight"])
        return module(x)

    nexts = torch.tensor(ids[1:])
    e = F.linear(norm("enorm", ref.model.embed_tokens(nexts)), extra["e_proj.weight"])  # [T, D]
    x = (e[:, None] + F.linear(norm("hnorm", streams[:-1]), extra["h_proj.weight"]))[None]  # [1, T, N, D]
    positions = torch.arange(len(nexts))[None]
    embeds = torch.zeros(1, len(nexts), cfg.hidden_size)
    rope = {
        kind: ref.model.rotary_emb(embeds, position_ids=positions, layer_type=kind) for kind in ("main", "compress")
    }
    mask = create_sliding_window_causal_mask(
        config=ref.config, inputs_embeds=embeds, attention_mask=None, cache=None, position_ids=positions
    )
    out = ref.model.layers[0](
        x, position_embeddings=rope, position_ids=positions, attention_mask=mask, input_ids=nexts[None]
    )
    expected = ref.lm_head(ref.model.norm(ref.model.hc_head(out)))[0]
    assert (ours - expected).abs().max().item() < 1e-5
