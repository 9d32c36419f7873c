"""dayzero's forward vs transformers' DeepseekV4ForCausalLM on tiny random checkpoints (fp32).

Tolerance 1e-4 absolute on logits: both sides compute in fp32 with the same operations up
to summation order, so honest differences are ~1e-7; a wrong mask, position or state
shows up at 1e-3 or more.
"""

from __future__ import annotations

import logging
import re

import pytest
import torch

from dayzero.align import reference_model
from dayzero.checkpoint import load_model
from dayzero.kv.pools import pools_for
from dayzero.model.forward import prefill, score

from .conftest import random_ids

TOL = 1e-4
SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"

CONFIGS = {
    "sliding_only": dict(layer_types=[SLIDING] * 3),
    "csa_sparse": dict(layer_types=[CSA, CSA, SLIDING], index_topk=3, hc_mult=1),
    "hca": dict(layer_types=[HCA, SLIDING, HCA], hc_mult=4),
    "mixed_hc2": dict(hc_mult=2),
    "all_hash": dict(mlp_layer_types=["hash_moe"] * 3, hc_mult=4),
    "yarn_compress": dict(
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        layer_types=[CSA, HCA, CSA],
    ),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_prompt_logits_match_reference(checkpoint_factory, name):
    path = checkpoint_factory(name, **CONFIGS[name])
    ref, ours = reference_model(path), load_model(path, progress=False)
    ids = random_ids(70, ours.cfg.vocab_size, seed=1)  # > window (8), > several compression blocks
    with torch.no_grad():
        expected = ref(torch.tensor([ids])).logits[0]
    got = score(ours, pools_for(ours.cfg, torch.float32, len(ids)), "s", ids)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() < TOL
    assert expected.abs().max().item() > 100 * TOL  # the comparison is not between two near-zero tensors


def test_batch_of_two_prompts_matches_reference_run_separately(checkpoint_factory):
    path = checkpoint_factory("mixed_hc2", **CONFIGS["mixed_hc2"])
    ref, ours = reference_model(path), load_model(path, progress=False)
    prompts = [random_ids(45, ours.cfg.vocab_size, seed=2), random_ids(19, ours.cfg.vocab_size, seed=3)]
    pools = pools_for(ours.cfg, torch.float32, 45, max_sequences=2)
    got = prefill(ours, pools, ["a", "b"], prompts, chunk_size=16)  # packed, chunked, ragged
    for row, ids in enumerate(prompts):
        with torch.no_grad():
            expected = ref(torch.tensor([ids])).logits[0, -1]
        assert (got[row] - expected).abs().max().item() < TOL


def test_align_tells_indexer_ties_from_errors(checkpoint_factory, monkeypatch):
    """3 indexer heads: many scores are exactly 0 (every head's ReLU at zero) and torch's topk picks
    among tied entries in its own order; dayzero picks the earliest. Judged with the reference's ties
    broken the same way it passes, and reports the ties; a sign flipped in dayzero's indexer still fails."""
    from dayzero import align as align_module

    path = checkpoint_factory("three_index_heads", seed=2, index_n_heads=3, index_topk=2)
    prompt = random_ids(48, 96, seed=2)
    report = align_module.align(path, prompt, tokens=4)
    assert report.plain_max_abs_err > 1e-3  # torch's own tie order differs from dayzero's here
    assert report.tied_queries > 0 and report.indexer_queries == 48  # one CSA layer, 48 queries
    assert report.ok and report.max_abs_err < 1e-5

    def flipped(*args, **kwargs):
        model = load_model(*args, **kwargs)
        for block in model.layers:
            if hasattr(block.attn, "indexer"):
                block.attn.indexer.weights_proj.weight.neg_()
        return model

    monkeypatch.setattr(align_module, "load_model", flipped)
    assert not align_module.align(path, prompt, tokens=4).ok


def test_the_reference_s_load_report_leaves_out_the_vision_tower_and_keeps_a_real_unexpected_key(tmp_path):
    """``align`` of a checkpoint with a vision tower (``demo-checkpoint --vision``, the built-in model)
    printed transformers' load report of the reference: 16 rows of ``visual.*`` weights "UNEXPECTED",
    "not ok if you expect identical arch", while the text model has no tower. A key the text model
    should have read is still reported."""
    from safetensors.torch import load_file, save_file

    from dayzero.demo import write_demo_checkpoint

    def logged_loading(path) -> str:
        """What transformers logs while the reference loads (its own handler's stream and its logger's
        propagation depend on what ran before)."""
        reports = []
        handler = logging.Handler()
        handler.emit = lambda record: reports.append(record.getMessage())
        log = logging.getLogger("transformers.modeling_utils")
        log.addHandler(handler)
        try:
            reference_model(path)
        finally:
            log.removeHandler(handler)
        return "\n".join(reports)

    path = write_demo_checkpoint(tmp_path / "vision", vision=True)
    assert "LOAD REPORT" not in logged_loading(path)  # the tower's rows were all of it
    tensors = load_file(path / "model.safetensors")
    assert any(name.startswith("visual.") for name in tensors)
    save_file({**tensors, "layers.0.stray.weight": torch.zeros(2)}, path / "model.safetensors", {"format": "pt"})
    report = logged_loading(path)
    assert "LOAD REPORT" in report and "visual." not in report
    assert re.search(r"^layers\.0\.stray\.weight +\| UNEXPECTED", report, re.MULTILINE), report
