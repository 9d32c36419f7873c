"""A bench that compares two trees is run in each one's checkout with one venv: it must import the
code of the tree it is in, not the tree the venv's editable install points at (bench/body_parse.py
measured the install's gateway from any checkout unless PYTHONPATH was set)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
MARK = "the other tree's gateway"


def test_body_parse_imports_the_gateway_of_its_own_tree(tmp_path):
    (tmp_path / "bench").mkdir()
    for name in ("body_parse.py", "options.py"):
        shutil.copy(BENCH / name, tmp_path / "bench")
    gateway = tmp_path / "services" / "gateway"
    gateway.mkdir(parents=True)
    for module in (tmp_path / "services" / "__init__.py", gateway / "__init__.py", gateway / "json_body.py"):
        module.write_text("async def parse(body):\n    return None\n" if module.name == "json_body.py" else "")
    (gateway / "app.py").write_text(f"print({MARK!r})\n")
    cmd = [sys.executable, "bench/body_parse.py", "--mb", "1", "--runs", "1", "--only", "token ids"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert MARK in done.stdout, done.stdout
    assert "| token ids | parsed |" in done.stdout, done.stdout


def test_a_tree_compared_with_itself_is_two_rows_of_its_rounds(tmp_path, monkeypatch, capsys):
    """bench/tree_ab.py (gateway_read_ab.py's and gateway_command_ab.py's runner) run with one tree
    twice (the noise an A/B carries): its numbers were kept by tree, so both processes' went to one
    row, twice the rounds long (and "2 rounds alternated" for one), its median of both."""
    import dayzero.procs

    monkeypatch.syspath_prepend(str(BENCH))
    from tree_ab import alternated, print_rounds

    monkeypatch.setattr(dayzero.procs, "scratch_redis", lambda folder: contextlib.nullcontext(1))  # (none asked)
    child = tmp_path / "child.py"
    child.write_text("print(7)\n")
    numbers = alternated(str(child), [tmp_path, tmp_path], 1, [])
    assert numbers == [[7.0], [7.0]]
    print_rounds([tmp_path, tmp_path], numbers, digits=0)
    out = capsys.readouterr().out
    assert out.startswith("1 rounds alternated"), out
    assert out.count(f"| {tmp_path} | 7 | 7 |") == 2, out


def test_inspect_plan_times_the_inspect_of_the_trees_it_names(tmp_path):
    """bench/inspect_plan.py without --trees timed the venv's editable install (the main checkout) from
    any clone, under "this tree"; with --trees, each tree's own."""
    cli = "import pathlib\npathlib.Path(__file__).parents[2].joinpath('imported').touch()\nmain = lambda argv: 0\n"
    trees = [tmp_path / name for name in ("self", "a", "b")]
    for tree in trees:
        (tree / "shared" / "dayzero").mkdir(parents=True)
        (tree / "shared" / "dayzero" / "__init__.py").write_text("")
        (tree / "shared" / "dayzero" / "cli.py").write_text(cli)
    (trees[0] / "bench").mkdir()
    for name in ("inspect_plan.py", "options.py"):
        shutil.copy(BENCH / name, trees[0] / "bench")
    cmd = [sys.executable, "bench/inspect_plan.py", "--runs", "1"]
    done = subprocess.run(cmd, cwd=trees[0], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "this tree" in done.stdout and [t.name for t in trees if (t / "imported").exists()] == ["self"]
    (trees[0] / "imported").unlink()
    done = subprocess.run([*cmd, "--trees", *map(str, trees[1:])], cwd=trees[0], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [t.name for t in trees if (t / "imported").exists()] == ["a", "b"]
