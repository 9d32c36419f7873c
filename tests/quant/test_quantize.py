"""`dayzero quantize` refuses, before writing anything, what it would destroy or could not serve;
what it writes is readable as the umask allows and has no empty shard."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from dayzero import cli
from dayzero.quant.quantize import quantize_checkpoint
from dayzero.quant.shards import write_shards

from .test_fp4_model import FP4_CONFIG


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def float_copy(checkpoint_factory, tmp_path) -> Path:
    """A float checkpoint whose shapes the FP4 and FP8 tiles divide (a copy: tests damage it)."""
    return Path(shutil.copytree(checkpoint_factory("fp4_src", **FP4_CONFIG), tmp_path / "float"))


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield
    os.umask(old)


def _error(argv: list[str], capsys) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    return err.strip()


@pytest.mark.parametrize("output", [".", "sub", ".."])
def test_an_output_that_is_the_input_inside_it_or_around_it_is_refused(float_copy, output, capsys):
    before = _snapshot(float_copy.parent)
    dst = (float_copy / output).resolve()
    error = _error(["quantize", str(float_copy), str(float_copy / output)], capsys)
    assert error == f"error: the output {dst} must not be the input {float_copy}, inside it or around it"
    assert _snapshot(float_copy.parent) == before  # not a byte written or removed


def test_an_already_quantized_checkpoint_is_refused(float_copy, tmp_path, capsys):
    quantized = quantize_checkpoint(float_copy, tmp_path / "q", progress=False)
    error = _error(["quantize", str(quantized), str(tmp_path / "again")], capsys)
    assert error == (
        f"error: {quantized} is already quantized (its tensors hold float8_e4m3fn, float8_e8m0fnu, int8): "
        "quantize takes a float checkpoint"
    )
    assert not (tmp_path / "again").exists()
    config = json.loads((float_copy / "config.json").read_text())  # float tensors, a config that says otherwise
    (float_copy / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "fp8"}}))
    error = _error(["quantize", str(float_copy), str(tmp_path / "again")], capsys)
    assert error == (
        f"error: {float_copy} is already quantized (its config.json has a quantization_config): "
        "quantize takes a float checkpoint"
    )


def test_a_truncated_input_is_one_line_and_writes_nothing(float_copy, tmp_path, capsys):
    weights = float_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    error = _error(["quantize", str(float_copy), str(tmp_path / "out")], capsys)
    assert error.startswith("error: model.safetensors is not a readable safetensors file: ")
    assert not (tmp_path / "out").exists()


def test_more_shards_than_tensors_are_refused_before_quantizing(float_copy, tmp_path, capsys):
    tensors = len(_header(float_copy / "model.safetensors"))
    error = _error(["quantize", str(float_copy), str(tmp_path / "out"), "--shards", str(tensors + 1)], capsys)
    assert error == f"error: --shards must be from 1 to the checkpoint's {tensors} tensors, got {tensors + 1}"
    assert not (tmp_path / "out").exists()


def _header(file: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as f:
        return {k: f.get_slice(k).get_shape() for k in f.keys()}  # noqa: SIM118 - not a mapping


def test_no_shard_is_left_empty_by_one_large_tensor(tmp_path):
    tensors = {"a": torch.zeros(1000), "b": torch.zeros(1), "c": torch.zeros(1)}
    files = write_shards(tensors, tmp_path, 3)
    assert [list(_header(f)) for f in files] == [["a"], ["b"], ["c"]]


def test_weights_are_written_with_the_umask_like_the_config(float_copy, tmp_path, umask_027):
    """The tokenizer files it carries over too (they kept the source's mode, 0644 here)."""
    (float_copy / "tokenizer.json").write_text("{}")
    (float_copy / "tokenizer.json").chmod(0o644)
    (float_copy / "encoding").mkdir()
    (float_copy / "encoding" / "encoding_dsv4.py").write_text("REASONING_EFFORT_MAX = (")  # the effort table's source
    out = quantize_checkpoint(float_copy, tmp_path / "q", progress=False, shards=2)
    assert (out / "encoding" / "encoding_dsv4.py").read_text() == "REASONING_EFFORT_MAX = ("
    (out / "encoding" / "encoding_dsv4.py").unlink()
    (out / "encoding").rmdir()
    written = sorted(p.name for p in out.iterdir())
    assert written == [
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
    ]
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in out.iterdir()} == dict.fromkeys(written, "0o640")


def test_only_the_indexs_shards_are_quantized(float_copy, tmp_path):
    """A sharded checkpoint's index names its weights: another ``*.safetensors`` beside them (an old
    copy, here all zeros, read last in name order) is not read."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(float_copy / "model.safetensors")
    (float_copy / "model.safetensors").unlink()
    write_shards(tensors, float_copy, 2)
    save_file({name: torch.zeros_like(t) for name, t in tensors.items()}, float_copy / "original.safetensors")
    quantized = load_file(quantize_checkpoint(float_copy, tmp_path / "q", progress=False) / "model.safetensors")
    (float_copy / "original.safetensors").unlink()
    alone = load_file(quantize_checkpoint(float_copy, tmp_path / "alone", progress=False) / "model.safetensors")
    assert quantized.keys() == alone.keys()
    assert all(torch.equal(quantized[k], alone[k]) for k in alone)
