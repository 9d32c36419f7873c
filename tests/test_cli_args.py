"""Arguments no command could use are argparse's usage errors (exit 2), before anything is loaded,
trained or written (parsed only here: a check that regressed runs no command)."""

from __future__ import annotations

import pytest

from dayzero import cli


def _refused(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        cli.parser().parse_args(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (
            ["generate", "--prompt", "hi", "--tensor-parallel", "0"],
            "argument --tensor-parallel: must be at least 1, got 0",
        ),
        (["align", "ckpt", "--tensor-parallel", "0"], "argument --tensor-parallel: must be at least 1, got 0"),
        (["inspect", "deepseek-v4-flash", "--devices", "0"], "argument --devices: must be at least 1, got 0"),
        (["inspect", "deepseek-v4-flash", "--devices", "-2"], "argument --devices: must be at least 1, got -2"),
        (["inspect", "deepseek-v4-flash", "--batch", "-1"], "argument --batch: must be at least 1, got -1"),
        (["inspect", "deepseek-v4-flash", "--context", "0"], "argument --context: must be at least 1, got 0"),
        (
            ["inspect", "deepseek-v4-flash", "--expert-cache-gib", "-1"],
            "argument --expert-cache-gib: must be a number of 0 or more, got -1",
        ),
        (
            ["inspect", "deepseek-v4-flash", "--expert-cache-gib", "inf"],
            "argument --expert-cache-gib: must be a number of 0 or more, got inf",
        ),
        (
            ["inspect", "deepseek-v4-flash", "--tensor-parallel", "0"],
            "argument --tensor-parallel: must be at least 1, got 0",
        ),
        (["up", "--port", "70000"], "argument --port: must be a port from 1 to 65535, got 70000"),
        (["up", "--port", "-1"], "argument --port: must be a port from 1 to 65535, got -1"),
        (["up", "--port", "0"], "argument --port: must be a port from 1 to 65535, got 0"),
        (["up", "--port", "http"], "argument --port: invalid port value: 'http'"),
        (["train-demo", "out", "--steps", "0"], "argument --steps: must be at least 1, got 0"),
        (["train-demo", "out", "--steps", "-1"], "argument --steps: must be at least 1, got -1"),
        (["train-demo", "out", "--steps", "many"], "argument --steps: invalid int value: 'many'"),
        (["train-demo", "out", "--threads", "0"], "argument --threads: must be at least 1, got 0"),
        (["train-demo", "out", "--minutes", "-1"], "argument --minutes: must be a number above 0, got -1"),
        (["train-demo", "out", "--minutes", "0"], "argument --minutes: must be a number above 0, got 0"),
        # text that is no number names the number it should be (was "invalid positive_float value")
        (["train-demo", "out", "--minutes", "ten"], "argument --minutes: invalid float value: 'ten'"),
        (["alive", "decode", "--within", "x"], "argument --within: invalid float value: 'x'"),
        (["up", "--ready-timeout", "x"], "argument --ready-timeout: invalid float value: 'x'"),
        (["demo-checkpoint", "out", "--shards", "0"], "argument --shards: must be at least 1, got 0"),
        (["demo-checkpoint", "out", "--shards", "-2"], "argument --shards: must be at least 1, got -2"),
        (["quantize", "in", "out", "--shards", "0"], "argument --shards: must be at least 1, got 0"),
        (  # was "error: Overflow when unpacking long long", once the corpus was split
            ["train-demo", "out", "--seed", str(1 << 64)],
            f"argument --seed: must be a 64-bit integer, from -2**63 to 2**63 - 1, got {1 << 64}",
        ),
        (
            ["demo-checkpoint", "out", "--seed", str(-(1 << 63) - 1)],
            f"argument --seed: must be a 64-bit integer, from -2**63 to 2**63 - 1, got {-(1 << 63) - 1}",
        ),
    ],
)
def test_sizes_counts_and_ports_out_of_range_are_usage_errors(argv, error, capsys):
    assert _refused(argv, capsys) == f"dayzero {argv[0]}: error: {error}"


@pytest.mark.parametrize(
    ("argv", "argument"),
    [
        (["demo-checkpoint", "{file}"], "OUT"),
        (["train-demo", "{file}", "--steps", "1"], "OUT"),
        (["train-demo", "{dir}/out", "--float", "{file}/float"], "--float"),
        (["quantize", "{dir}", "{file}"], "OUT"),
        (["up", "--log-dir", "{file}/logs"], "--log-dir"),
    ],
)
def test_an_output_directory_that_is_a_file_is_a_usage_error(argv, argument, tmp_path, capsys):
    file = tmp_path / "hostname"
    file.write_text("not a directory\n")
    argv = [a.format(file=file, dir=tmp_path) for a in argv]
    assert _refused(argv, capsys) == f"dayzero {argv[0]}: error: argument {argument}: {file} is a file, not a directory"
    assert file.read_text() == "not a directory\n"


def test_train_demo_refuses_float_weights_in_its_output_before_training(tmp_path, monkeypatch, capsys):
    from dayzero.train import pipeline

    monkeypatch.setattr(pipeline, "train_demo", lambda *a: pytest.fail("trained before checking its directories"))
    out = tmp_path / "model"
    assert cli.main(["train-demo", str(out), "--float", str(out / "float"), "--steps", "1"]) == 2
    expected = f"error: --float {out / 'float'} must not be OUT {out}, inside it or around it"  # (not "the input")
    assert capsys.readouterr().err.strip() == expected
