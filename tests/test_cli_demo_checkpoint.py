"""`dayzero demo-checkpoint`: the release's tokens and layout, and an OUT replaced whole or left as it was."""

from __future__ import annotations

import json
from os import umask

import pytest
import torch

from dayzero import cli
from dayzero.quant.shards import write_shards

from .conftest import run_dayzero
from .transformers_logs import shown_warnings, transformers_loggers_on_closed_streams


@pytest.mark.slow
def test_demo_checkpoint_carries_the_released_special_tokens(tmp_path, transformers_logs, capsys, recwarn):
    """In this process (cli.main, as ``python -m dayzero.cli`` calls it: a process of its own runs below)."""
    from tokenizers import Tokenizer

    assert cli.main(["demo-checkpoint", str(tmp_path / "d"), "--fp4", "--shards", "2"]) == 0, capsys.readouterr().err
    assert len(list((tmp_path / "d").glob("model-0000?-of-00002.safetensors"))) == 2
    tok = Tokenizer.from_file(str(tmp_path / "d" / "tokenizer.json"))
    released = [
        "<｜begin▁of▁sentence｜>",
        "<｜end▁of▁sentence｜>",
        "<｜User｜>",
        "<｜Assistant｜>",
        "<think>",
        "</think>",
    ]
    released += ["<｜latest_reminder｜>", "<｜deepseek_image｜>", "｜DSML｜"]
    ids = [tok.token_to_id(t) for t in released]
    assert None not in ids and ids[:2] == [0, 1]  # BOS 0, EOS 1 as in the release
    assert tok.token_to_id("<|begin▁of▁sentence|>") is None  # no ASCII look-alikes
    assert tok.encode("<｜User｜>hi<｜Assistant｜></think>", add_special_tokens=False).ids[0] == ids[2]
    capsys.readouterr()
    al = cli.main(["align", str(tmp_path / "d"), "--tokens", "2", "--json"])  # transformers loads it too
    printed = capsys.readouterr()
    assert al == 0 and json.loads(printed.out)["ok"], printed.out + printed.err
    assert shown_warnings(recwarn) == []  # on a process's stderr, which the assertions above read


def test_transformers_still_logs_after_the_commands_above_ran_in_this_process(transformers_logs):
    """(After the test above, as the file runs:) transformers' handlers write to no closed capsys stream."""
    assert transformers_loggers_on_closed_streams(transformers_logs) == []


def test_demo_checkpoint_replaces_an_older_sharded_one_with_the_umask_s_modes(tmp_path):
    out = tmp_path / "d"
    out.mkdir()
    write_shards({name: torch.zeros(2) for name in "abc"}, out, 3)  # an older checkpoint's shards and index
    old = umask(0o027)
    try:
        made = run_dayzero("demo-checkpoint", str(out), "--seed", "5")
    finally:
        umask(old)
    assert made.returncode == 0, made.stderr
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in out.iterdir()}
    names = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert modes == dict.fromkeys(names, "0o640")


def test_demo_checkpoint_refused_shards_leave_out_as_it_was(tmp_path, capsys):
    """More shards than the checkpoint has tensors: refused, and OUT untouched (the refusal came
    after the weights and config were written: a half checkpoint, or a vision one's overwritten)."""
    out = tmp_path / "d"
    assert cli.main(["demo-checkpoint", str(out), "--vision"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert cli.main(["demo-checkpoint", str(out), "--shards", "100000"]) == 2
    assert "error: --shards must be from 1 to the checkpoint's " in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]  # no build left beside it
    assert cli.main(["demo-checkpoint", str(tmp_path / "new"), "--shards", "100000"]) == 2
    assert not (tmp_path / "new").exists()


def test_an_out_that_cannot_be_written_is_named_not_its_temporary_build(capsys):
    """(Under /proc: "No such file or directory: '/proc/.dayzero-test.v0qfnv2_'".)"""
    assert cli.main(["demo-checkpoint", "/proc/dayzero-test"]) == 2
    assert capsys.readouterr().err == "error: [Errno 2] cannot write /proc/dayzero-test: No such file or directory\n"
    assert cli.main(["demo-checkpoint", "/sys/dayzero-test"]) == 1  # sysfs refuses it (PermissionError: a traceback)
    assert capsys.readouterr().err.startswith("error: [Errno 1] cannot write /sys/dayzero-test: ")
