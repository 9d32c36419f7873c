"""A 4096-token prompt through the pooled sparse runtime matches transformers (fp32, 1e-4 abs)."""

from __future__ import annotations

import pytest
import torch

from dayzero.align import reference_model
from dayzero.checkpoint import load_model
from dayzero.kv.pools import pools_for
from dayzero.model.forward import decode, prefill

from .conftest import random_ids

LONG = dict(
    sliding_window=64,
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
    index_topk=8,
    layer_types=["compressed_sparse_attention", "heavily_compressed_attention", "compressed_sparse_attention"],
)


@pytest.mark.slow
def test_4096_prompt_and_32_greedy_steps_match_reference(checkpoint_factory):
    from transformers import DynamicCache

    path = checkpoint_factory("long", **LONG)
    ref, ours = reference_model(path), load_model(path, progress=False)
    prompt = random_ids(4096, ours.cfg.vocab_size, seed=21)
    cache = DynamicCache(config=ref.config)
    with torch.no_grad():
        ref_logits = ref(torch.tensor([prompt]), cache=cache, use_cache=True).logits[0, -1]
    pools = pools_for(ours.cfg, torch.float32, 4096 + 32)
    logits = prefill(ours, pools, ["s"], [prompt], chunk_size=512)[0]  # 8 chunks of the pooled runtime
    assert (logits - ref_logits).abs().max().item() < 1e-4
    for _ in range(32):
        token = int(ref_logits.argmax())
        assert int(logits.argmax()) == token
        with torch.no_grad():
            ref_logits = ref(torch.tensor([[token]]), cache=cache, use_cache=True).logits[0, -1]
        logits = decode(ours, pools, ["s"], [token])[0]
        assert (logits - ref_logits).abs().max().item() < 1e-4
