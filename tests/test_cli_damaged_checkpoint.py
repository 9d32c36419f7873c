"""A checkpoint a command cannot use (a damaged config, a corrupt tokenizer, a path that is no checkpoint
directory): one line naming what is wrong, exit 2, nothing started."""

from __future__ import annotations

import json
import shutil

import pytest

from dayzero import cli


@pytest.mark.parametrize(
    "command",
    [
        ["inspect", "{ckpt}"],
        ["generate", "--checkpoint", "{ckpt}", "--prompt-ids", "1"],
        ["up", "--checkpoint", "{ckpt}", "--log-dir", "{logs}"],
    ],
)
def test_a_damaged_config_is_one_line_naming_the_key(command, tiny_checkpoint, tmp_path, capsys, monkeypatch):
    from dayzero import stack

    monkeypatch.setattr(stack.Stack, "start", lambda self: pytest.fail("up started a stack"))
    ckpt = shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "hidden_size": -128}))
    assert cli.main([a.format(ckpt=ckpt, logs=tmp_path / "logs") for a in command]) == 2
    assert (
        capsys.readouterr().err == f"error: {ckpt / 'config.json'}: hidden_size must be a positive integer, got -128\n"
    )
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize(
    "command",
    [
        ["inspect", "{ckpt}"],
        ["generate", "--checkpoint", "{ckpt}", "--prompt-ids", "1"],
        ["align", "{ckpt}"],
    ],
)
def test_a_config_json_that_is_a_directory_is_one_line_naming_it(command, tiny_checkpoint, tmp_path, capsys):
    """It was "error: [Errno 21] Is a directory: '.../config.json'" and exit 1, the code of the host's
    faults (a full disk), for an input error."""
    ckpt = shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    (ckpt / "config.json").unlink()
    (ckpt / "config.json").mkdir()
    assert cli.main([a.format(ckpt=ckpt) for a in command]) == 2
    config = ckpt / "config.json"
    assert capsys.readouterr().err == f"error: {config} is not a file: give a checkpoint directory or its config.json\n"


@pytest.mark.parametrize("command", [["inspect", "{ckpt}"], ["up", "--checkpoint", "{ckpt}", "--log-dir", "{logs}"]])
def test_a_size_left_out_of_the_config_is_named_beside_its_tensor(command, tiny_checkpoint, tmp_path, capsys):
    """A key left out takes transformers' default (V4-Flash's 64 heads): the first tensor to
    disagree is named, and now the key too (the line named only the tensor)."""
    ckpt = shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    config = json.loads((ckpt / "config.json").read_text())
    del config["num_attention_heads"]
    (ckpt / "config.json").write_text(json.dumps(config))
    assert cli.main([a.format(ckpt=ckpt, logs=tmp_path / "logs") for a in command]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: tensor ") and len(err.splitlines()) == 1
    assert err.endswith("; config.json lacks num_attention_heads (transformers' default taken)\n")


@pytest.mark.parametrize("command", [["generate", "--prompt", "hello"], ["up", "--log-dir", "{tmp}/logs"]])
def test_a_corrupt_tokenizer_is_one_line_naming_the_file(command, tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """``up`` too, before it starts anything (its gateway crash-looped and up printed a traceback)."""
    from dayzero import stack

    monkeypatch.setattr(stack.Stack, "start", lambda self: pytest.fail("up started a stack"))
    ckpt = shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    (ckpt / "tokenizer.json").write_text('{"version": "1.0",\n')
    argv = [a.format(tmp=tmp_path) for a in command]
    assert cli.main([argv[0], "--checkpoint", str(ckpt), *argv[1:]]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {ckpt / 'tokenizer.json'} is not valid: ") and len(err.splitlines()) == 1


def test_generate_names_a_checkpoint_directory_that_does_not_exist(tmp_path, capsys):
    assert cli.main(["generate", "--checkpoint", str(tmp_path / "nowhere"), "--prompt", "x", "--stop", "y"]) == 2
    assert capsys.readouterr().err == f"error: checkpoint directory {tmp_path / 'nowhere'} does not exist\n"


def test_a_checkpoint_given_as_a_file_is_named_a_file(tiny_checkpoint, capsys):
    """(It was said not to exist.)"""
    config = tiny_checkpoint / "config.json"
    assert cli.main(["generate", "--checkpoint", str(config), "--prompt-ids", "1"]) == 2
    assert cli.main(["align", str(config), "--prompt-ids", "1"]) == 2
    assert capsys.readouterr().err == f"error: {config} is a file: give the checkpoint's directory\n" * 2


def test_an_empty_checkpoint_path_is_named_empty(capsys):
    """(``Path("")`` is the working directory: "no config.json at config.json".)"""
    assert cli.main(["inspect", ""]) == 2
    assert cli.main(["align", "", "--prompt-ids", "1"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["error: an empty path: give a checkpoint directory or its config.json"] + [
        "error: an empty path: give the checkpoint's directory"
    ]
