from __future__ import annotations

import json

import pytest

from dayzero.config import CSA, HCA, SLIDING, ConfigError, ModelConfig

from .conftest import tiny_config


def test_compress_ratios_list_form():
    raw = tiny_config(layer_types=None, compress_ratios=[0, 4, 8])  # the tiny config's HCA rate is 8
    cfg = ModelConfig.from_dict(raw)
    assert cfg.layer_types == (SLIDING, CSA, HCA)
    assert cfg.compress_rate(0) == 0 and cfg.compress_rate(1) == 4 and cfg.compress_rate(2) == 8


def test_release_compress_ratios_carry_the_mtp_layer_last():
    # as released: one entry per layer plus the MTP layer's (0: sliding window only)
    raw = {"model_type": "deepseek_v4", "num_hidden_layers": 4, "compress_ratios": [0, 0, 4, 128, 0]}
    cfg = ModelConfig.from_dict({**raw, "num_nextn_predict_layers": 1})
    assert cfg.layer_types == (SLIDING, SLIDING, CSA, HCA) and cfg.mtp_layer_type == SLIDING
    assert cfg.num_nextn_predict_layers == 1 and cfg.compress_rate(4) == 0
    with pytest.raises(ConfigError, match="compress_ratios has 6 entries; expected 4"):
        ModelConfig.from_dict({**raw, "compress_ratios": [0, 0, 4, 128, 0, 0]})
    with pytest.raises(ConfigError, match=r"must be 0, 4 \(CSA\) or 128 \(HCA\); got \[16\]"):
        ModelConfig.from_dict({**raw, "compress_ratios": [0, 0, 4, 16]})


def test_transformers_defaults_are_v4_flash():
    cfg = ModelConfig.from_dict({"model_type": "deepseek_v4"})
    assert (cfg.hidden_size, cfg.num_layers, cfg.head_dim, cfg.rope_head_dim) == (4096, 43, 512, 64)
    assert cfg.layer_types[:2] == (HCA, HCA) and cfg.mlp_layer_types[:4] == ("hash_moe",) * 3 + ("moe",)


def test_nested_and_flat_rope_parameters():
    nested = ModelConfig.from_dict(
        tiny_config(
            rope_parameters={
                "main": {"rope_type": "default", "rope_theta": 500.0},
                "compress": {
                    "rope_type": "yarn",
                    "rope_theta": 7000.0,
                    "factor": 16,
                    "original_max_position_embeddings": 64,
                    "attention_factor": 1.0,  # as transformers saves it (absent: test_config_rope.py)
                },
            }
        )
    )
    assert nested.rope_main.theta == 500.0 and nested.rope_compress.rope_type == "yarn"
    flat = ModelConfig.from_dict(
        tiny_config(
            rope_theta=100.0,
            compress_rope_theta=900.0,
            rope_parameters={"rope_type": "yarn", "factor": 2, "original_max_position_embeddings": 32},
        )
    )
    assert flat.rope_main.rope_type == "default" and flat.rope_main.theta == 100.0
    assert flat.rope_compress.theta == 900.0 and flat.rope_compress.factor == 2.0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model_type": "llama"}, "model_type"),
        ({"scoring_func": "relu"}, "scoring_func"),
        ({"layer_types": [SLIDING, "dense_attention", CSA]}, "layer_types"),
        ({"compress_ratios": [0, 3, 128], "layer_types": None}, "compress_ratios"),
        ({"rope_parameters": {"rope_type": "longrope"}}, "rope_type"),
        ({"num_key_value_heads": 2}, "num_key_value_heads"),
        ({"mlp_layer_types": ["moe"]}, "mlp_layer_types"),
    ],
)
def test_unsupported_values_are_named(overrides, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_dict(tiny_config(**overrides))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"hidden_size": -128}, "hidden_size must be a positive integer, got -128"),
        ({"hidden_size": "abc"}, "hidden_size must be a positive integer, got 'abc'"),
        ({"hidden_size": True}, "hidden_size must be a positive integer, got True"),
        ({"num_attention_heads": 4.5}, "num_attention_heads must be a positive integer, got 4.5"),
        ({"vocab_size": 0}, "vocab_size must be a positive integer, got 0"),
        ({"num_nextn_predict_layers": -1}, "num_nextn_predict_layers must be an integer >= 0, got -1"),
        ({"rms_norm_eps": 0}, "rms_norm_eps must be a number above 0, got 0"),
        ({"rope_parameters": "x"}, "rope_parameters must be a JSON object, got 'x'"),
        ({"layer_types": "sliding_attention"}, "layer_types must be a JSON list, got 'sliding_attention'"),
        ({"compress_rates": {CSA: 0, HCA: 8}}, f"{CSA} must be a positive integer, got 0"),
        (
            {"rope_parameters": {"rope_type": "yarn", "factor": 2}},
            "original_max_position_embeddings must be a positive integer, got None",
        ),
    ],
)
def test_values_of_the_wrong_type_or_range_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as error:
        ModelConfig.from_dict(tiny_config(**overrides))
    assert str(error.value) == message


def test_a_config_file_error_names_the_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError) as error:
        ModelConfig.from_file(tmp_path)
    assert str(error.value) == f"{path}: must hold a JSON object, got list"
    path.write_text(json.dumps(tiny_config(hidden_size=-128)))
    with pytest.raises(ConfigError) as error:
        ModelConfig.from_file(path)
    assert str(error.value) == f"{path}: hidden_size must be a positive integer, got -128"


def test_a_config_file_that_is_not_utf8_is_named(tmp_path):
    """``inspect DIR/model.safetensors`` said only "'utf-8' codec can't decode byte ..."."""
    path = tmp_path / "config.json"
    path.write_bytes(b'{"hidden_size": "\xd2"}')
    with pytest.raises(ConfigError, match=f"^{path} is not valid JSON: 'utf-8' codec can't decode byte 0xd2"):
        ModelConfig.from_file(tmp_path)
