"""The benches run: each ``bench/*.py`` (found by glob: a new one is covered) answers ``--help`` with its
options and exits 0 without doing its work, and the ones quick on a CPU run for real at their smallest
sizes, one stack bench (``bench/serve.py``) among them, so that ``bench/demo_stack.py`` is run end to end.

``--help`` and the in-process smoke runs are run as ``python bench/X.py ARGS`` would run them (the
script as ``__main__``, ``bench/`` first on the path), but one after another in one fresh interpreter
(``RUNNER``): a process each paid torch's import 42 times (2-8 s each on two shared cores). Each run
gets back the process state the benches change (the environment, the working directory, torch's
thread count and default dtype, sys.path) as it was before it, and an alarm: a hang is ended and named by its
bench's test. The CUDA paths run too: on a host without CUDA each says so and exits 0."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"
# modules the benches import, not benches
HELPERS = {
    "attention_prefill.py",
    "demo_stack.py",
    "options.py",
    "peak_rss.py",
    "sse_clients.py",
    "timing.py",
    "tree_ab.py",
}
BENCHES = sorted(p.name for p in BENCH.glob("*.py") if p.name not in HELPERS)
WORK_S = 20  # a --help still running after this is doing its work: ended (its test fails), the rest go on
SMOKE_S = 300  # a smoke run still running after this hangs (each takes seconds): ended, named, the rest go on

# Runs each of argv's JSON invocations ([script, args...]) as ``python script args...`` would, in turn;
# prints one JSON line per invocation: its exit code, its output, its seconds. A run past its alarm
# (``seconds`` in the invocation) is ended and reported as exit code "alarm". What a run changes of the
# process's state (``kept``, ``put_back``) is put back before the next.
RUNNER = """
import contextlib, io, json, os, runpy, signal, sys, time, traceback
import torch  # (every bench's: its state is put back after each run)

class Alarm(BaseException):
    pass

def ring(*_):
    raise Alarm()

def kept():
    return list(sys.path), dict(os.environ), os.getcwd(), torch.get_num_threads(), torch.get_default_dtype()

def put_back(path, environ, cwd, threads, dtype):
    sys.path[:] = path
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    torch.set_num_threads(threads)
    torch.set_default_dtype(dtype)

signal.signal(signal.SIGALRM, ring)
for spec in map(json.loads, sys.argv[1:]):
    script, args, out, began = spec["argv"][0], spec["argv"][1:], io.StringIO(), time.perf_counter()
    sys.argv, code, state = [script, *args], 0, kept()
    sys.path.insert(0, script.rsplit("/", 1)[0])
    signal.alarm(spec["seconds"])
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:  # (a message as its code: printed, exit code 1, as the interpreter does)
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=out)
    except Alarm:
        code = "alarm"
    except BaseException:
        code, _ = 1, out.write(traceback.format_exc())
    finally:
        signal.alarm(0)
        put_back(*state)
    print(json.dumps({"code": code, "output": out.getvalue(), "seconds": time.perf_counter() - began}), flush=True)
"""


def run_in_one_process(invocations: list[dict]) -> list[dict]:
    """Each invocation's result (``RUNNER``), in order, run in one fresh interpreter."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # (TRITON_INTERPRET: conftest.py sets it where no GPU is)
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, *map(json.dumps, invocations)], capture_output=True, text=True, env=env
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith('{"code"')]
    assert len(lines) == len(invocations), done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line) for line in lines]


# A bench that changes what the runner puts back, one that reads it, one that hangs
CHANGES = """
import os, sys, torch
os.environ["DAYZERO_BENCH_LEFT"], _ = "1", os.chdir("/")
sys.path.insert(0, "/nowhere")
torch.set_num_threads(torch.get_num_threads() + 1)
torch.set_default_dtype(torch.float64)
"""
READS = """
import os, sys, torch
print(os.environ.get("DAYZERO_BENCH_LEFT"), os.getcwd(), "/nowhere" in sys.path, torch.get_num_threads(),
      torch.get_default_dtype())
"""
HANGS = "import time\ntime.sleep(600)\n"


def test_each_run_gets_the_state_before_it_and_a_hang_ends_alone(tmp_path):
    """tests/test_benches.py's runner: what one bench set (kernel_builds.py its TRITON_CACHE_DIR,
    parallel.py torch's thread count) is not what the next one runs under; a hang past its alarm is
    reported as that run's, and the runs after it go on."""
    for name, text in (("changes.py", CHANGES), ("reads.py", READS), ("hangs.py", HANGS)):
        (tmp_path / name).write_text(text)
    names = ["reads.py", "changes.py", "reads.py", "hangs.py", "reads.py"]
    got = run_in_one_process([{"argv": [str(tmp_path / n)], "seconds": 2} for n in names])
    assert [g["code"] for g in got] == [0, 0, 0, "alarm", 0], got
    first = got[0]["output"]
    assert first.startswith("None ") and "float32" in first, first
    assert got[2]["output"] == got[4]["output"] == first, got


@pytest.mark.parametrize("name", BENCHES)
def test_bench_answers_help_without_its_work(ran, name):
    got = ran[f"help:{name}"]
    assert got["code"] == 0, got["output"][-3000:]
    assert got["output"].startswith("usage: "), got["output"][-3000:]  # (argparse: its options, then exit)
    summary = ast.get_docstring(ast.parse((BENCH / name).read_text())).splitlines()[0]
    assert summary in got["output"], got["output"][-3000:]  # (bench_parser: its docstring)


def test_helpers_are_no_benches():
    """A module the benches import is named in HELPERS and has no main of its own (else it is a bench)."""
    for name in HELPERS:
        assert "__main__" not in (BENCH / name).read_text(), name


# The in-process benches at their smallest: each a few seconds on a CPU (bench/handoff.py's measure runs
# in test_stack_bench_runs: serve.py's last step; its own cases each spawn an importer process)
SMOKE = {
    "model.py": ["--prompt-tokens", "16", "--new-tokens", "2", "--runs", "1"],
    "attention.py": ["--quick", "--parts", "decode,state", "--contexts", "256"],
    "detokenize.py": ["--tokens", "50", "--stops", "0", "2", "--runs", "1"],
    "moe.py": ["--layers", "2", "--experts", "4", "--tokens", "4", "--runs", "1"],
    "parallel.py": ["--layers", "2", "--experts", "4", "--steps", "2", "--batch", "1", "--prompt-tokens", "8"],
    "vision.py": ["--sides", "56", "--runs", "1", "--depth", "2"],
    # (^a{300000}$: ERR under both limits, as the default pattern, in a third of its time)
    "guided.py": ["--steps", "2", "--batches", "2", "--pattern", "^a{300000}$"],
    "literal_steps.py": ["--runs", "1", "--steps", "2", "--chars", "50"],
    "reply_parse.py": ["--kb", "1", "--runs", "1"],
    "body_validate.py": ["--keys", "1000", "--runs", "1"],
    "guided_compile.py": ["--properties", "10", "--enum-chars", "100"],
    "kernels.py": ["--smoke", "--runs", "1"],
    "host_syncs.py": ["--steps", "1", "--batch", "1", "--prompt-tokens", "16"],
    "fencing.py": ["--batch", "1", "--rounds", "1"],
    "redis_parsers.py": ["--batch", "1", "--calls", "5"],
    "reaper_round_trips.py": ["--passes", "1"],
    "gateway_read_ab.py": [str(BENCH.parent), str(BENCH.parent), "--rounds", "1", "--entries", "2"],
    "gateway_command_ab.py": [str(BENCH.parent), str(BENCH.parent), "--rounds", "1", "--gets", "2", "--cpu"],
    "prefill_starvation.py": ["--loads", "1.0", "--horizon", "50", "--seeds", "1", "--long", "300", "--long-at", "10"],
}
# What needs a CUDA GPU, on a host without one: a line saying so, exit 0 (bench/options.py's need_cuda)
NEED_CUDA = {
    "kernels.py": [],
    "handoff.py": ["--transport", "cuda_ipc"],
    "attention.py": ["--device", "cuda"],
    "decode_launches.py": ["--device", "cuda"],
}


@pytest.fixture(scope="module")
def ran() -> dict[str, dict]:
    """Each bench's ``--help`` (keys ``help:NAME``), each smoke run (``SMOKE``, keys ``NAME``), each CUDA
    run (``NEED_CUDA``, keys ``cuda:NAME``): their results, all from one interpreter (torch and dayzero
    imported once; two interpreters paid them twice, 8-19 s on two shared cores)."""
    cudas = {} if torch.cuda.is_available() else NEED_CUDA  # (with a GPU these would run the real thing)
    runs = {f"help:{name}": {"argv": [str(BENCH / name), "--help"], "seconds": WORK_S} for name in BENCHES}
    runs |= {name: {"argv": [str(BENCH / name), *args], "seconds": SMOKE_S} for name, args in SMOKE.items()}
    runs |= {f"cuda:{name}": {"argv": [str(BENCH / name), *args], "seconds": WORK_S} for name, args in cudas.items()}
    return dict(zip(runs, run_in_one_process(list(runs.values())), strict=True))


@pytest.mark.parametrize("name", SMOKE)
def test_bench_runs_at_its_smallest(ran, name):
    got = ran[name]
    assert got["code"] == 0, got["output"][-3000:]
    assert got["output"].strip(), name  # (its figures)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is here: these run for real")
@pytest.mark.parametrize("name", NEED_CUDA)
def test_bench_needing_cuda_says_so_on_a_cpu(ran, name):
    got = ran[f"cuda:{name}"]
    assert got["code"] == 0, got["output"][-3000:]
    assert "needs a CUDA GPU and this host has none" in got["output"], got["output"][-3000:]


@pytest.mark.slow
def test_stack_bench_runs():
    """``bench/serve.py`` at its smallest on a stack of its own (``demo_stack``): started, served, stopped."""
    args = ["--requests", "2", "--rate", "50", "--prompt-tokens", "8", "--max-tokens", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(BENCH / "serve.py"), *args], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["failed"] == 0, done.stdout[-3000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is here")
def test_gpu_session_fails_where_torch_sees_no_cuda(tmp_path):
    """``bench/gpu.sh`` on a host whose torch has no CUDA: each bench there would say so and exit 0
    (``NO_GPU_EXIT``), each GPU test skip: the session passed having measured nothing. It fails first."""
    (tmp_path / "bench").mkdir()
    shutil.copy(BENCH / "gpu.sh", tmp_path / "bench")  # (no .whl/ there: what follows the check would fail too)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "bench/gpu.sh"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "sees no CUDA GPU: nothing to measure" in done.stderr + done.stdout
    assert "sees no CUDA GPU" in (tmp_path / "out" / "gpu.log").read_text()  # (the log the device tool brings back)
