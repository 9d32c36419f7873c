"""Stored tensors that would load wrong numbers without an error are refused, naming them:
a tensor stored twice, a block scale beside a weight that is not FP8, a block-scale grid that
one rank refuses but a split rank slices anyway, an E8M0 NaN scale in an expert the weight
check does not sample. Each was found loading silently (the stale copy, the unscaled weight,
rank 1's rows scaled by rank 0's scales, NaN weights in expert 1)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dayzero.checkpoint import CheckpointError, load_model
from dayzero.parallel import Group, ParallelConfig
from dayzero.quant.quantize import quantize_checkpoint

from .parallel.test_tensor_parallel import FP8_TP2


@pytest.fixture(scope="module")
def release(checkpoint_factory, tmp_path_factory) -> Path:
    """FP8 dense (wq_b: 256 rows, two 128-row blocks), FP4 experts (4), float8_e8m0fnu scales, 2 shards."""
    src = checkpoint_factory("fp8_tp2", **FP8_TP2)
    return quantize_checkpoint(src, tmp_path_factory.mktemp("pairs"), progress=False, shards=2)


def _shards(path: Path) -> dict[str, dict[str, torch.Tensor]]:
    out = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            out[file.name] = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    return out


def _edited(release: Path, dst: Path, edit) -> Path:
    """A copy of ``release`` whose shards ``edit(shards)`` changed in place (the index kept)."""
    shutil.copytree(release, dst)
    shards = _shards(dst)
    edit(shards)
    for name, tensors in shards.items():
        save_file(tensors, str(dst / name))
    return dst


def _where(shards: dict, key: str) -> str:
    return next(name for name, tensors in shards.items() if key in tensors)


def test_a_tensor_stored_twice_is_refused_naming_both_files(release, tmp_path):
    key = "layers.0.attn_norm.weight"
    files: list[str] = []

    def stale_copy(shards):  # the index names one shard; another holds a second copy (all 7.0)
        named = _where(shards, key)
        other = next(name for name in shards if name != named)
        shards[other][key] = torch.full_like(shards[named][key], 7.0)
        files.extend([named, other])

    path = _edited(release, tmp_path / "twice", stale_copy)
    assert json.loads((path / "model.safetensors.index.json").read_text())["weight_map"][key] == files[0]
    with pytest.raises(CheckpointError, match=rf"'{key}' in .* is stored twice") as err:
        load_model(path, progress=False)  # it loaded the stale copy (7.0) the index does not name
    assert all(name in str(err.value) for name in files)

    def two_spellings(shards):  # DeepSeek's .scale and transformers' .weight_scale_inv of one weight
        named = _where(shards, "layers.0.attn.wkv.scale")
        shards[named]["layers.0.attn.wkv.weight_scale_inv"] = shards[named]["layers.0.attn.wkv.scale"].clone()

    with pytest.raises(CheckpointError, match=r"'layers.0.attn.wkv.(scale|weight_scale_inv)' .* stored twice"):
        load_model(_edited(release, tmp_path / "spellings", two_spellings), progress=False)


def test_a_block_scale_beside_a_weight_that_is_not_fp8_is_refused(release, tmp_path):
    def unscaled(shards):  # the e4m3 values upcast to bf16 but not multiplied by their scales
        named = _where(shards, "layers.0.attn.wkv.weight")
        shards[named]["layers.0.attn.wkv.weight"] = shards[named]["layers.0.attn.wkv.weight"].to(torch.bfloat16)

    with pytest.raises(CheckpointError, match=r"'layers.0.attn.wkv.scale' scales 'layers.0.attn.wkv.weight', which is"):
        load_model(_edited(release, tmp_path / "bf16", unscaled), progress=False)


def test_a_short_block_scale_grid_is_refused_on_every_rank(release, tmp_path):
    key = "layers.0.attn.wq_b.scale"  # [2, 1] for a [256, 32] weight: one block row per rank of 2

    def short(shards):
        named = _where(shards, key)
        shards[named][key] = shards[named][key][:1]

    path = _edited(release, tmp_path / "short", short)
    for rank in (0, 1):  # rank 1 read rank 0's block row as its own (one rank refused it)
        with pytest.raises(CheckpointError, match=rf"'{key}' has shape \[1, 1\]: .* are \[2, 1\]"):
            load_model(path, progress=False, group=Group(ParallelConfig(2, rank), object()))


def test_a_nan_scale_in_an_expert_the_weight_check_does_not_sample_is_refused(release, tmp_path):
    key = "layers.1.ffn.experts.1.w2.scale"  # the check decodes experts 0, 2 and 3 of 4

    def nan_scale(shards):
        named = _where(shards, key)
        exponents = shards[named][key].view(torch.uint8).clone()
        exponents[3, 0] = 0xFF  # E8M0 NaN: 32 weights of expert 1 decoded to NaN at its first use
        shards[named][key] = exponents.view(torch.float8_e8m0fnu)

    with pytest.raises(CheckpointError, match=rf"{key}: a scale is 0xFF \(NaN in E8M0\)"):
        load_model(_edited(release, tmp_path / "nan", nan_scale), progress=False)


@pytest.mark.parametrize(
    ("key", "bad"),
    [
        ("hc_head_scale", float("nan")),  # served NaN logits for every request
        ("layers.0.attn_norm.weight", float("inf")),
        ("layers.1.hc_ffn_base", float("nan")),
        ("embed.weight", float("-inf")),  # a large one: every float tensor is checked, not only small ones
    ],
)
def test_a_non_finite_value_in_a_plain_float_tensor_is_refused(release, key, bad, tmp_path):
    """Tensors stored without scales (norms, hyper-connection base and scale, embeddings) were loaded
    as they are: one NaN there served NaN output with no error at start."""

    def poisoned(shards):
        named = _where(shards, key)
        tensor = shards[named][key].clone()
        tensor.view(-1)[-1] = bad
        shards[named][key] = tensor

    with pytest.raises(CheckpointError, match=rf"^{key}: non-finite values \(NaN or inf\)$"):
        load_model(_edited(release, tmp_path / "poisoned", poisoned), progress=False)
