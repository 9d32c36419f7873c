"""config.json fields that change the maths, read as transformers reads them, or refused at load.

Each case writes the config.json by hand (transformers re-saves a normalised one) and compares
with transformers' DeepseekV4ForCausalLM loading the same directory: fp32, 1e-4 as test_forward.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from dayzero.align import reference_model
from dayzero.checkpoint import load_model
from dayzero.config import ConfigError, ModelConfig
from dayzero.kv.pools import pools_for
from dayzero.model.forward import score

from .conftest import random_ids, tiny_config

TOL = 1e-4
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "rope_theta": 1e5}


def _nested(main: dict, compress: dict) -> dict:
    return {"main": {"rope_type": "default", "rope_theta": 1e4, **main}, "compress": {"rope_theta": 1.6e5, **compress}}


def _with_config(src: Path, dst: Path, **raw) -> Path:
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, **raw}))
    return dst


def test_nested_partial_rotary_factor_sizes_the_rotation(tiny_checkpoint, tmp_path):
    """Nested rope_parameters carry their own partial_rotary_factor: transformers rotates 4 dims of
    each 16-wide head here, not the top-level 0.5's 8 (dayzero rotated 8: logits off by ~4)."""
    rope = _nested({"partial_rotary_factor": 0.25}, {"rope_type": "default", "partial_rotary_factor": 0.25})
    path = _with_config(tiny_checkpoint, tmp_path / "quarter", rope_parameters=rope)
    assert ModelConfig.from_file(path).rope_head_dim == 4
    ref, ours = reference_model(path), load_model(path, progress=False)
    ids = random_ids(40, ours.cfg.vocab_size, seed=1)
    with torch.no_grad():
        expected = ref(torch.tensor([ids])).logits[0]
    got = score(ours, pools_for(ours.cfg, torch.float32, len(ids)), "s", ids)
    assert (got - expected).abs().max().item() < TOL


def test_different_rope_dims_per_rope_type_are_refused():
    rope = _nested({"partial_rotary_factor": 0.25}, {"rope_type": "default", "partial_rotary_factor": 0.5})
    with pytest.raises(ConfigError, match=r"rotate 4 \(main\) and 8 \(compress\) dims"):
        ModelConfig.from_dict(tiny_config(rope_parameters=rope))


@pytest.mark.parametrize(
    ("extra", "expected"),
    [({}, 0.1 * torch.log(torch.tensor(4.0)).item() + 1), ({"mscale": 1.0, "mscale_all_dim": 0.5}, None)],
)
def test_nested_yarn_without_attention_factor_is_refused(extra, expected):
    """transformers derives YaRN's attention factor when a nested rope_parameters leaves it out
    (the flat form gets 1.0) and scales cos / sin by it; dayzero never scales them, so it refuses."""
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4RotaryEmbedding

    raw = tiny_config(rope_parameters=_nested({"partial_rotary_factor": 0.5}, {**YARN, **extra}))
    scaling = DeepseekV4RotaryEmbedding(DeepseekV4Config(**raw)).compress_attention_scaling
    assert scaling != 1.0 and (expected is None or abs(scaling - expected) < 1e-6)
    with pytest.raises(ConfigError, match=f"yarn attention_factor {scaling:.6g} is not supported"):
        ModelConfig.from_dict(raw)
    same = tiny_config(rope_parameters=_nested({}, {**YARN, **extra, "attention_factor": 1.0}))
    assert ModelConfig.from_dict(same).rope_compress.factor == 4.0


def test_index_head_dim_below_the_rope_dim_is_refused_at_load():
    """The indexer ropes the trailing rope dims of its heads (transformers fails in its forward):
    it was a shape error from dayzero's compressor at the first forward."""
    with pytest.raises(ConfigError, match="index_head_dim must be >= the rope dim"):
        ModelConfig.from_dict(tiny_config(index_head_dim=4))  # rope dim 8
    ModelConfig.from_dict(tiny_config(index_head_dim=4, layer_types=["sliding_attention"] * 3))  # no indexer


def test_tied_embeddings_are_refused_by_name():
    """transformers ties the head to the embedding (and saves no head.weight); dayzero has its own head."""
    with pytest.raises(ConfigError, match="tie_word_embeddings"):
        ModelConfig.from_dict(tiny_config(tie_word_embeddings=True))
